"""The size of a data URL's image read from its header (`_image_header.py`), against
Pillow's `Image.open` on real images of many formats, modes and sizes, and on
hostile data: compressed chunks before the header, many segments, truncation,
garbage. No server."""

from __future__ import annotations

import base64
import binascii
import io
import struct
import warnings
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offload_vllm._image_header import MAX_STEPS, UNSIZED, read_size
from PIL import Image, PngImagePlugin

from ._images import IDAT, PNG, ZTXT, compressed_text_png, ihdr, png_chunk

# Pillow warns (DecompressionBombWarning) for the large sizes some cases claim.
pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")

MODES = ("RGB", "L", "RGBA", "P", "1", "LA", "CMYK", "I;16")


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def saved(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def pillow_size(data: bytes) -> tuple[int, int] | None:
    """What vLLM's `Image.open` reports, or `None` if it refuses the data."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as image:
                return image.size
    except Exception:
        return None


def pillow_loads(data: bytes) -> bool:
    """Whether Pillow decodes the data's pixels without an error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as image:
                image.load()
        return True
    except Exception:
        return False


@st.composite
def images(draw: st.DrawFn) -> tuple[bytes, str]:
    """A real image file: format, mode, size and metadata drawn."""
    fmt = draw(st.sampled_from(["PNG", "JPEG", "GIF", "WEBP"]))
    mode = draw(st.sampled_from(MODES))
    width = draw(st.one_of(st.integers(1, 64), st.integers(65, 1500)))
    height = draw(st.one_of(st.integers(1, 64), st.integers(65, 1500)))
    image = Image.new(mode, (width, height))
    options: dict[str, Any] = {}
    if fmt == "JPEG":
        options["progressive"] = draw(st.booleans())
        if draw(st.booleans()):
            options["exif"] = b"Exif\x00\x00" + bytes(draw(st.integers(0, 60_000)))
        if draw(st.booleans()):
            options["icc_profile"] = bytes(draw(st.integers(1, 200_000)))
    if fmt == "PNG" and draw(st.booleans()):
        info = PngImagePlugin.PngInfo()
        for i in range(draw(st.integers(1, 5))):
            info.add_text(f"k{i}", "text " * draw(st.integers(0, 500)), zip=draw(st.booleans()))
        options["pnginfo"] = info
    try:
        return saved(image, fmt, **options), fmt
    except (OSError, ValueError, KeyError):
        return saved(image.convert("RGB"), fmt, **options), fmt


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(images())
def test_the_size_is_pillows_for_real_images(image: tuple[bytes, str]) -> None:
    data, fmt = image
    assert read_size(data_url(data)) == pillow_size(data), fmt


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
@pytest.mark.parametrize("size", [(1, 1), (1, 16383), (16383, 1), (4000, 4000), (12345, 7)])
def test_the_size_is_pillows_at_the_extremes(fmt: str, size: tuple[int, int]) -> None:
    try:
        data = saved(Image.new("L", size), fmt)
    except (OSError, ValueError):
        pytest.skip(f"Pillow does not write a {size} {fmt}")
    assert read_size(data_url(data)) == pillow_size(data) == size


def test_animated_images_are_the_canvas() -> None:
    frames = [Image.new("RGB", (40, 30), (i * 40, 0, 0)) for i in range(4)]
    for fmt in ("GIF", "WEBP", "PNG"):
        data = saved(frames[0], fmt, save_all=True, append_images=frames[1:])
        assert read_size(data_url(data)) == pillow_size(data) == (40, 30), fmt
    # A GIF whose first frame reaches past its logical screen grows to hold it.
    gif = bytearray(saved(Image.new("L", (10, 10)), "GIF"))
    descriptor = gif.index(b",")
    gif[descriptor + 5 : descriptor + 9] = struct.pack("<HH", 300, 200)
    assert read_size(data_url(bytes(gif))) == pillow_size(bytes(gif)) == (300, 200)


def test_the_media_type_is_not_read_as_vllm_reads_none() -> None:
    """vLLM loads any `data:...;base64,` URL as an image, whatever its media type."""
    png = saved(Image.new("RGB", (640, 480)), "PNG")
    for head in ("data:image/png", "DATA:image/jpeg", "data:application/octet-stream", "data:", "data:x;charset=y"):
        assert read_size(f"{head};base64,{base64.b64encode(png).decode()}") == (640, 480), head
    body = base64.b64encode(png).decode()
    for not_loaded in (f"data:image/png,{body}", f"data:image/png;base64{body}", f"image/png;base64,{body}"):
        assert read_size(not_loaded) is None


# ---- hostile data ---------------------------------------------------------------------


ITXT = png_chunk(b"iTXt", b"k\x00\x01\x00\x00\x00" + zlib.compress(b"a" * (1 << 20), 9))
ICCP = png_chunk(b"iCCP", b"p\x00\x00" + zlib.compress(b"a" * (1 << 20), 9))


class Decoded:
    """Counts the base64 characters the reader decodes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.characters = 0
        real = binascii.a2b_base64

        def counting(text: Any, **kwargs: Any) -> bytes:
            self.characters += len(text)
            return real(text, **kwargs)

        monkeypatch.setattr(binascii, "a2b_base64", counting)


def no_decompression(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decompressed or opened while reading a header")

    for name in ("decompress", "decompressobj"):
        monkeypatch.setattr(zlib, name, refuse)
    monkeypatch.setattr(Image, "open", refuse)


@pytest.mark.parametrize("before", [ZTXT, ITXT, ICCP], ids=["zTXt", "iTXt", "iCCP"])
def test_compressed_chunks_are_skipped_by_their_length(before: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """60 compressed chunks (80 KB of base64, 60 MiB inflated) after the header,
    or before it: Pillow inflates each; the reader skips each by its length."""
    after = compressed_text_png(before)
    ahead = PNG + before * 60 + ihdr(64, 64) + IDAT + png_chunk(b"IEND", b"")
    expected = [pillow_size(after), pillow_size(ahead)]
    decoded = Decoded(monkeypatch)
    no_decompression(monkeypatch)
    assert [read_size(data_url(after)), read_size(data_url(ahead))] == expected == [(64, 64), (64, 64)]
    assert decoded.characters < 2 * 70 * 16


def test_a_png_whose_header_is_past_the_walk_is_unsized(monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = png_chunk(b"tEXt", b"k\x00v")
    data = PNG + tiny * (MAX_STEPS + 1) + ihdr(5000, 5000) + IDAT
    assert pillow_size(data) == (5000, 5000)
    decoded = Decoded(monkeypatch)
    assert read_size(data_url(data)) is UNSIZED
    assert decoded.characters <= (MAX_STEPS + 2) * 16


def jpeg_with(segments: bytes, width: int = 300, height: int = 200) -> bytes:
    """A real JPEG with `segments` inserted after its start-of-image marker."""
    data = saved(Image.new("RGB", (width, height)), "JPEG")
    return data[:2] + segments + data[2:]


def app_segment(n: int, payload: bytes = b"") -> bytes:
    return bytes([0xFF, 0xE0 + n]) + struct.pack(">H", len(payload) + 2) + payload


def test_jpeg_segments_are_skipped_by_their_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata of ~1 MB in 64 KB segments (APPn, COM, fill bytes) before the frame header."""
    big = b"".join(app_segment(n % 16, bytes(65_000)) for n in range(15)) + b"\xff\xfe\x00\x04ab" + b"\xff\xff"
    data = jpeg_with(big)
    decoded = Decoded(monkeypatch)
    assert read_size(data_url(data)) == pillow_size(data) == (300, 200)
    assert decoded.characters < 40 * 16


def test_many_jpeg_segments_stop_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    data = jpeg_with(app_segment(1) * 20_000)  # 80 KB of empty APP1 segments
    assert pillow_size(data) == (300, 200)
    decoded = Decoded(monkeypatch)
    assert read_size(data_url(data)) is UNSIZED
    assert decoded.characters <= (MAX_STEPS + 2) * 16
    # Junk bytes between segments, which Pillow skips one at a time, count as steps too.
    assert read_size(data_url(jpeg_with(b"\x00" * 1000))) is UNSIZED


def test_gif_extensions_are_skipped_by_their_blocks() -> None:
    gif = saved(Image.new("P", (120, 80)), "GIF")
    screen_end = 13 + (3 << ((gif[10] & 7) + 1) if gif[10] & 128 else 0)
    comment = b"!\xfe" + b"\x05hello" * 10 + b"\x00"
    data = gif[:screen_end] + comment + gif[screen_end:]
    assert read_size(data_url(data)) == pillow_size(data) == (120, 80)
    endless = gif[:screen_end] + b"!\xfe" + b"\x01a" * 1000 + b"\x00" + gif[screen_end:]
    assert read_size(data_url(endless)) is UNSIZED


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["PNG", "JPEG", "GIF", "WEBP"]), st.data())
def test_a_truncated_image_is_sized_only_if_pillow_opens_it(fmt: str, data: st.DataObject) -> None:
    """Any prefix of a real file: the reader never raises; `None` (priced as
    text) only where Pillow decodes no pixels either, and a size only where
    Pillow reports the same or refuses the file."""
    whole = saved(Image.new("RGB", (200, 100), (10, 20, 30)), fmt, **({"exif": bytes(300)} if fmt == "JPEG" else {}))
    prefix = whole[: data.draw(st.integers(0, len(whole)))]
    got = read_size(data_url(prefix))
    if got is None:
        assert not pillow_loads(prefix)
    elif got is not UNSIZED:
        # A size where Pillow then refuses the file (a WebP cut after its header) overprices it only.
        size = pillow_size(prefix)
        assert size is None or got == size


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from([b"", PNG, b"\xff\xd8\xff", b"GIF89a", b"RIFF\x00\x00\x00\x00WEBPVP8 ", b"RIFF\x00\x00\x00\x00WEBPVP8L"]),
    st.binary(max_size=200),
)
def test_garbage_never_raises_and_never_undercuts_pillow(magic: bytes, tail: bytes) -> None:
    data = magic + tail
    got = read_size(data_url(data))
    if got is None:
        assert not pillow_loads(data)
    elif got is not UNSIZED:
        size = pillow_size(data)
        assert size is None or got == size


@pytest.mark.parametrize(
    "text",
    [
        "data:image/png;base64,AAAA",
        "data:image/png;base64,iVBORw0KGgo",  # not a whole number of base64 groups
        "data:image/png;base64,iVBO!w0KGgo=",
        "data:image/png;base64,iVBORw0KGgoé===",
        "data:image/png;base64,",
        "data:image/png;base64,====",
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA",
    ],
)
def test_bad_base64_and_short_data(text: str) -> None:
    got = read_size(text)
    assert got is None or got is UNSIZED
    if got is None:
        try:
            raw = base64.b64decode(text.partition(",")[2], validate=True)
        except ValueError:
            return  # vLLM refuses it before Pillow sees it
        assert not pillow_loads(raw)
