"""Image data for pricing tests."""

from __future__ import annotations

import base64
import struct
import zlib


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    """A PNG chunk: length, type, payload, CRC."""
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def forged_png(width: int, height: int) -> str:
    """A data URL of 110 characters (66 bytes) whose header Pillow opens, claiming `width` x `height`."""
    return "data:image/png;base64," + base64.b64encode(PNG + ihdr(width, height) + png_chunk(b"IDAT", bytes(21))).decode()


def ihdr(width: int, height: int) -> bytes:
    """An IHDR chunk of an 8-bit RGB image of `width` x `height`."""
    return png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


#: The PNG signature.
PNG = b"\x89PNG\r\n\x1a\n"
#: A compressed text chunk of ~1 KB that inflates to Pillow's limit per chunk (1 MiB).
ZTXT = png_chunk(b"zTXt", b"k\x00\x00" + zlib.compress(b"a" * (1 << 20), 9))
#: The image data of a black 64 x 64 RGB image.
IDAT = png_chunk(b"IDAT", zlib.compress(b"\x00" * (3 * 64 + 1) * 64))


def compressed_text_png(chunks: bytes = ZTXT, count: int = 60) -> bytes:
    """A 64 x 64 PNG with `count` compressed `chunks` after its header: Pillow
    inflates each when it opens the file (~1 MiB each)."""
    return PNG + ihdr(64, 64) + chunks * count + IDAT + png_chunk(b"IEND", b"")


def one_pixel_png() -> str:
    """A data URL of a valid 1 x 1 RGB PNG (114 characters): the least an image can be."""
    pixel = png_chunk(b"IDAT", zlib.compress(b"\x00" + bytes(3)))
    return "data:image/png;base64," + base64.b64encode(PNG + ihdr(1, 1) + pixel + png_chunk(b"IEND", b"")).decode()
