"""Image loading against pixels set by hand: RGB values kept, alpha dropped, grey and palette images
made RGB, EXIF orientation applied, oversized and broken files refused."""
from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from graphc.runtime import media
from graphc.runtime.media import MediaError, load_image


def encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def pattern(w: int = 5, h: int = 3) -> list[tuple[int, int, int]]:
    return [((x * 40) % 256, (y * 70) % 256, (x + y) * 11 % 256) for y in range(h) for x in range(w)]


def test_rgb_pixels_come_back_as_channels_rows_columns():
    img = Image.new("RGB", (5, 3))
    img.putdata(pattern())
    got = load_image(encode(img))
    assert got.dtype == torch.uint8 and got.shape == (3, 3, 5)
    for y in range(3):
        for x in range(5):
            assert tuple(got[:, y, x].tolist()) == pattern()[y * 5 + x]


def test_alpha_is_dropped_and_grey_and_palette_become_rgb():
    rgba = Image.new("RGBA", (2, 1))
    rgba.putdata([(10, 20, 30, 0), (40, 50, 60, 255)])
    assert load_image(encode(rgba))[:, 0, :].T.tolist() == [[10, 20, 30], [40, 50, 60]]
    grey = Image.new("L", (2, 1))
    grey.putdata([7, 200])
    assert load_image(encode(grey))[:, 0, :].T.tolist() == [[7, 7, 7], [200, 200, 200]]
    pal = Image.new("P", (1, 1))
    pal.putpalette([0, 0, 0, 90, 80, 70] + [0] * 762)
    pal.putdata([1])
    assert load_image(encode(pal))[:, 0, 0].tolist() == [90, 80, 70]


def test_exif_orientation_turns_the_image_upright():
    # a 4 x 2 image whose EXIF says "rotate 90 clockwise to view" (orientation 6) is 2 wide, 4 high
    img = Image.new("RGB", (4, 2), (0, 0, 0))
    img.putpixel((0, 0), (255, 0, 0))                     # top-left red
    exif = Image.Exif()
    exif[0x0112] = 6
    got = load_image(encode(img, "PNG", exif=exif))
    assert got.shape == (3, 4, 2)
    assert got[:, 0, 1].tolist() == [255, 0, 0]            # top-left goes to top-right


def test_a_path_works(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(encode(Image.new("RGB", (3, 2), (1, 2, 3))))
    assert load_image(path).shape == (3, 2, 3)


def test_too_many_pixels_are_refused_from_the_header(monkeypatch):
    data = encode(Image.new("RGB", (300, 200)))

    def no_decoding(*a, **k):
        raise AssertionError("decoded an image its header already shows too large")

    monkeypatch.setattr(Image.Image, "convert", no_decoding)
    with pytest.raises(MediaError, match=r"300 x 200 = 60,000 pixels, at most 59,999"):
        load_image(data, max_pixels=59_999)
    assert media.MAX_IMAGE_PIXELS == 8192 * 8192


def noisy_jpeg() -> bytes:
    img = Image.frombytes("RGB", (64, 64), bytes(torch.randint(0, 256, (64 * 64 * 3,),
                                                                generator=torch.Generator().manual_seed(0)).tolist()))
    return encode(img, "JPEG", quality=95)


@pytest.mark.parametrize("data, why", [
    (b"not an image at all", "does not decode.*send PNG"),
    (noisy_jpeg()[:-2000], "does not decode.*send the whole file"),        # the header whole, pixels cut
], ids=["garbage", "truncated"])
def test_broken_images_are_refused(data, why):
    with pytest.raises(MediaError, match=why):
        load_image(data)
