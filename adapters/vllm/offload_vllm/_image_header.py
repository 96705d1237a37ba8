"""The pixel size of an image in a base64 data URL, read from its header bytes alone.

Pricing (`_cost.py`) runs on the event loop before admission, so it reads an
image's size without decoding it: no decompression, no plugin search, and a
bounded number of base64 characters decoded, a few at a time, where the
header says the next field is. The formats read are PNG, JPEG, GIF and WebP,
recognised by their magic bytes; each is walked as Pillow's opener walks it
(`PIL/PngImagePlugin.py`, `JpegImagePlugin.py`, `GifImagePlugin.py`,
`WebPImagePlugin.py`), so the size is the one vLLM's `Image.open` would
report, and the walk stops after `MAX_STEPS` chunks, segments or blocks.

`read_size` answers one of three things: the size; `None` when vLLM fails on
the data before decoding any pixels (not a base64 data URL, bad base64, a
truncated or malformed header of a format read here); or `UNSIZED` when the
data decodes as base64 but its size cannot be read here (another format
Pillow may still open, or a header longer than the walk's bounds).
"""

from __future__ import annotations

import binascii
import enum
import re
from typing import Final

#: How many chunks (PNG), segments (JPEG) or blocks (GIF) are walked before the
#: size must show: real files put it within a few (JPEG: APPn, DQT, DHT, then
#: SOF; PNG: IHDR first), a hostile file's thousands of tiny ones stop here.
MAX_STEPS: Final = 64

#: The furthest byte of the data a header is read at: a JPEG's size comes after
#: its metadata segments (EXIF, ICC profile, XMP: up to 64 KiB each), which are
#: skipped by their lengths, not decoded.
MAX_HEADER_BYTES: Final = 1 << 20


class Unsized(enum.Enum):
    """The answer for data that decodes but whose size is not read here."""

    UNSIZED = "unsized"


UNSIZED: Final = Unsized.UNSIZED

_PNG = b"\x89PNG\r\n\x1a\n"
_PNG_STOPS = frozenset({b"IDAT", b"IEND", b"fdAT"})
# What Pillow takes for a chunk's type (`PngImagePlugin.is_cid`).
_PNG_CHUNK_TYPE = re.compile(rb"\w\w\w\w")
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xDE})
# Markers Pillow reads with no length after them (no handler in its `MARKER`).
_JPEG_BARE = frozenset({0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)})
_SOS = 0xDA


class _Base64Bytes:
    """The bytes of base64 text, decoded on demand, only where they are read."""

    __slots__ = ("_end", "_start", "_text", "length")

    def __init__(self, text: str, start: int) -> None:
        self._text = text
        self._start = start
        self._end = len(text)
        #: How many bytes the whole text decodes to (if it is valid base64).
        self.length = (self._end - start) // 4 * 3 - (text.endswith("==") + text.endswith("="))

    def read(self, offset: int, n: int) -> bytes | None:
        """Bytes `offset` to `offset + n` of the data; `None` if they are not
        all there, or the base64 that holds them is not valid."""
        if offset < 0 or offset + n > MAX_HEADER_BYTES:
            return None
        first = self._start + offset // 3 * 4
        last = self._start + -(-(offset + n) // 3) * 4
        if last > self._end:
            return None
        try:
            chunk = binascii.a2b_base64(self._text[first:last], strict_mode=True)
        except (binascii.Error, ValueError):  # ValueError: a character outside ASCII
            return None
        skip = offset % 3
        got = chunk[skip : skip + n]
        return got if len(got) == n else None


def read_size(data_url: str) -> tuple[int, int] | Unsized | None:
    """`(width, height)` of the image in `data_url`, read from its header
    (see the module's docstring for `None` and `UNSIZED`). `data_url` is any
    string; vLLM loads it as a data URL when it begins with `data:` in any
    case and its media type ends with `;base64` (`MediaConnector._load_data_url`),
    whatever the media type says."""
    if data_url[:5].lower() != "data:":
        return None
    comma = data_url.find(",")
    if comma < 0 or not data_url.endswith(";base64", 0, comma):
        return None
    if (len(data_url) - comma - 1) % 4:
        return None  # vLLM decodes strictly: padding is required
    try:
        magic = binascii.a2b_base64(data_url[comma + 1 : comma + 17], strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    if not magic:
        return None
    data = _Base64Bytes(data_url, comma + 1)
    if magic.startswith(_PNG):
        return _png(data)
    if magic.startswith(b"\xff\xd8\xff"):
        return _jpeg(data)
    if magic.startswith((b"GIF87a", b"GIF89a")):
        return _gif(data)
    if magic.startswith(b"RIFF") and magic[8:12] == b"WEBP":
        return _webp(data)
    return UNSIZED


def _u16be(b: bytes, at: int = 0) -> int:
    return int.from_bytes(b[at : at + 2], "big")


def _u16le(b: bytes, at: int = 0) -> int:
    return int.from_bytes(b[at : at + 2], "little")


def _png(data: _Base64Bytes) -> tuple[int, int] | Unsized | None:
    """Chunks from the signature to the first image data (IDAT): the last IHDR's size."""
    size: tuple[int, int] | None = None
    offset = 8
    for _ in range(MAX_STEPS):
        header = data.read(offset, 8)
        if header is None:
            return UNSIZED if offset + 8 > MAX_HEADER_BYTES else None
        length, kind = int.from_bytes(header[:4], "big"), header[4:]
        if not _PNG_CHUNK_TYPE.match(kind):
            return None  # Pillow: "broken PNG file"
        if kind in _PNG_STOPS:
            return size
        if kind == b"IHDR":
            fields = data.read(offset + 8, 8) if length >= 13 else None
            if fields is None:
                return None  # Pillow: "Truncated IHDR chunk"
            size = int.from_bytes(fields[:4], "big"), int.from_bytes(fields[4:], "big")
        offset += 12 + length
    return UNSIZED


def _jpeg(data: _Base64Bytes) -> tuple[int, int] | Unsized | None:
    """Markers from the first to the start of scan (SOS): the last frame header's size."""
    size: tuple[int, int] | None = None
    offset = 2
    for _ in range(MAX_STEPS):
        marker = data.read(offset, 2)
        if marker is None:
            return UNSIZED if offset + 2 > MAX_HEADER_BYTES else None
        if marker[0] != 0xFF:
            offset += 1  # Pillow skips junk between segments, a byte at a time
            continue
        code = marker[1]
        if code == 0xFF:
            offset += 1  # fill byte
            continue
        if code == 0x00 or code in _JPEG_BARE:
            offset += 2
            continue
        if code < 0xC0:
            return None  # Pillow: "no marker found"
        length_bytes = data.read(offset + 2, 2)
        if length_bytes is None:
            return None
        length = _u16be(length_bytes)
        if code in _JPEG_SOF:
            frame = data.read(offset + 4, 6) if length >= 8 else None
            if frame is None or frame[0] != 8 or frame[5] not in (1, 3, 4):
                return None  # Pillow: truncated, or "cannot handle" its bits or layers
            size = _u16be(frame, 3), _u16be(frame, 1)
        elif code == _SOS:
            return size
        # Pillow reads the two length bytes, then what they say is left, if anything.
        offset += 4 + max(length - 2, 0)
    return UNSIZED


def _gif(data: _Base64Bytes) -> tuple[int, int] | Unsized | None:
    """The logical screen, grown to the first image descriptor's extent."""
    screen = data.read(0, 13)
    if screen is None:
        return None
    width, height = _u16le(screen, 6), _u16le(screen, 8)
    flags = screen[10]
    offset = 13 + ((3 << ((flags & 7) + 1)) if flags & 128 else 0)
    for _ in range(MAX_STEPS):
        introducer = data.read(offset, 1)
        if introducer is None or introducer == b";":
            return None  # Pillow: no image in the file
        if introducer == b",":
            descriptor = data.read(offset + 1, 8)
            if descriptor is None:
                return None
            x0, y0 = _u16le(descriptor, 0), _u16le(descriptor, 2)
            return max(width, x0 + _u16le(descriptor, 4)), max(height, y0 + _u16le(descriptor, 6))
        if introducer != b"!":
            offset += 1  # Pillow skips any other byte
            continue
        # An extension: its label, then data sub-blocks up to an empty one.
        offset += 2
        for _ in range(MAX_STEPS):
            block = data.read(offset, 1)
            if block is None:
                return None
            offset += 1 + block[0]
            if not block[0]:
                break
        else:
            return UNSIZED
    return UNSIZED


def _webp(data: _Base64Bytes) -> tuple[int, int] | Unsized | None:
    """The canvas (VP8X) or the frame's size (VP8, VP8L), as Pillow's `_get_size` reads it."""
    header = data.read(0, min(30, data.length))
    if header is None:
        return None
    chunk = header[12:16]
    if chunk == b"VP8 " and len(header) >= 30 and header[23:26] == b"\x9d\x01\x2a":
        return _u16le(header, 26) & 0x3FFF, _u16le(header, 28) & 0x3FFF
    if chunk == b"VP8X" and len(header) >= 30:
        return int.from_bytes(header[24:27], "little") + 1, int.from_bytes(header[27:30], "little") + 1
    if chunk == b"VP8L" and len(header) >= 25 and header[20] == 0x2F:
        bits = int.from_bytes(header[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None
