"""Audio and images are bounded by what their headers claim, before anything is decoded (issue 42, item 8): a
small file that decodes to gigabytes is one line naming the file, the size and the limit, which is settable."""

from __future__ import annotations

import base64
import io

import numpy as np
import PIL.Image
import pytest
import soundfile

from optimum_ipu.pipelines.audio import AudioDecodingError, read_audio
from optimum_ipu.pipelines.images import ImageDecodingError, read_image_file
from optimum_ipu.serving.errors import APIError
from optimum_ipu.serving.tasks import decode_input


@pytest.mark.parametrize(("channels", "frames", "fits"), [(8, 4_000, False), (1, 40_000, False), (2, 2_000, True)])
def test_audio_over_the_sample_limit_is_refused_from_its_header(
    tmp_path, monkeypatch, reliability, channels, frames, fits
):
    path = tmp_path / "clip.flac"
    soundfile.write(path, np.zeros((frames, channels), np.float32) + 0.01, 48_000, subtype="PCM_16")
    monkeypatch.setenv("OPTIMUM_IPU_MAX_AUDIO_SAMPLES", "30000")
    if fits:
        assert read_audio(str(path))[0].shape == (frames,)
        return
    reliability.expect_clear_error(
        lambda: read_audio(str(path)),
        (str(path), f"{channels} channel(s)", "30000 samples", "OPTIMUM_IPU_MAX"),
        (AudioDecodingError,),
    )


def _png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    PIL.Image.new("RGB", size).save(buffer, format="PNG")
    return buffer.getvalue()


def test_an_image_over_the_pixel_limit_is_refused_from_its_header(tmp_path, monkeypatch, reliability):
    path = tmp_path / "big.png"
    path.write_bytes(_png((300, 200)))
    monkeypatch.setenv("OPTIMUM_IPU_MAX_IMAGE_PIXELS", "50000")
    reliability.expect_clear_error(
        lambda: read_image_file(path),
        (str(path), "300 x 200 pixels", "OPTIMUM_IPU_MAX_IMAGE_PIXELS"),
        (ImageDecodingError,),
    )
    encoded = base64.b64encode(_png((300, 200))).decode()
    with pytest.raises(APIError, match="300 x 200 pixels"):  # the server's uploads: a 400 naming the field
        decode_input("image-classification", encoded, "inputs")
    monkeypatch.setenv("OPTIMUM_IPU_MAX_IMAGE_PIXELS", "60000")
    assert read_image_file(path).size == (300, 200)


@pytest.mark.parametrize("value", ["lots", "-5", "0"])
def test_a_bad_limit_names_the_variable(tmp_path, monkeypatch, value):
    path = tmp_path / "small.png"
    path.write_bytes(_png((4, 4)))
    monkeypatch.setenv("OPTIMUM_IPU_MAX_IMAGE_PIXELS", value)
    with pytest.raises(ValueError, match=f"OPTIMUM_IPU_MAX_IMAGE_PIXELS: got '{value}'"):
        read_image_file(path)
