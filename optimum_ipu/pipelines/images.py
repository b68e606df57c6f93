"""Images decoded with the file named in every error: what `pipeline("image-classification")` and the image
example script read.

`transformers.image_utils.load_image` opens a file lazily (a damaged one fails later, in the image processor,
without its name) and reports a path that does not exist as "Incorrect image source. Must be a valid URL...". Here
a path that is not there is reported as missing (with the name in its folder it was probably meant to be), a path
that is not a regular file as what it is, and every decode error names the file; the image is decoded whole
before it is returned. URLs, base64 strings and `PIL` images are `transformers`' `load_image`'s.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from typing import Any

from ..errors import positive_int_setting, short_repr
from ..files import nearest_sibling, not_a_file


class ImageDecodingError(ValueError):
    """An image that cannot be read or decoded; the message names the file (or URL) and the fix."""


# Pixels decoded at most (settable): a 163 KB PNG can claim 168 megapixels, 2.7 GB once decoded
MAX_PIXELS_VARIABLE = "OPTIMUM_IPU_MAX_IMAGE_PIXELS"
DEFAULT_MAX_PIXELS = 64_000_000


def max_image_pixels() -> int:
    """The most pixels an image may have to be decoded: `OPTIMUM_IPU_MAX_IMAGE_PIXELS`, else 64 million."""
    return positive_int_setting(MAX_PIXELS_VARIABLE, DEFAULT_MAX_PIXELS)


def check_image_size(image: Any, where: str, limit: int | None = None) -> None:
    """Refuse an opened (not yet decoded) image whose header claims more than `limit` (`max_image_pixels()`)
    pixels."""
    width, height = image.size
    limit = max_image_pixels() if limit is None else limit
    if width * height > limit:
        raise ImageDecodingError(
            f"{where}: the image is {width} x {height} pixels ({width * height / 1e6:.0f} megapixels), over the "
            f"limit of {limit / 1e6:g} million; resize it, or raise {MAX_PIXELS_VARIABLE}"
        )


def _decode(data: Any, where: str) -> Any:
    """`data` (a path or a binary stream) decoded whole as an RGB `PIL` image, upright by its EXIF orientation."""
    import PIL.Image
    import PIL.ImageOps

    limit = max_image_pixels()
    try:
        with PIL.Image.open(data) as image:
            check_image_size(image, where, limit)  # from the header, before anything is decoded
            image.load()
            return PIL.ImageOps.exif_transpose(image).convert("RGB")
    except ImageDecodingError:
        raise
    except PIL.Image.DecompressionBombError as err:
        raise ImageDecodingError(f"{where}: the image is too large to decode ({err}); resize it") from None
    except (OSError, ValueError, SyntaxError, EOFError) as err:  # PIL's decoders raise these on damaged data
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ImageDecodingError(
            f"{where}: cannot be decoded as an image ({short_repr(reason, 120).strip(chr(39))}); check that it is a "
            "whole image file (PNG, JPEG, ...) and re-export it"
        ) from None


def _base64_bytes(text: str) -> bytes | None:
    """The bytes of a base64 string (with or without a `data:image/...;base64,` prefix); None when it is not one."""
    body = text.split(",", 1)[1] if text.startswith("data:image/") and "," in text else text
    try:
        # an image is hundreds of bytes at least: a shorter string is a path (a missing one, reported as such)
        long_enough = text.startswith("data:image/") or len(body) >= 256
        return base64.b64decode(body, validate=True) if long_enough else None
    except (binascii.Error, ValueError):
        return None


def read_image_file(path: str | os.PathLike) -> Any:
    """The image at `path`, decoded whole as RGB.

    Raises:
        ImageDecodingError: the path is not there (with the nearest name in its folder), is not a regular file (a
            folder, a FIFO...), cannot be read, or does not decode as an image; the message names the path.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        near = nearest_sibling(path, cutoff=0.8)
        hint = f" (did you mean {near}?)" if near else ""
        raise ImageDecodingError(f"{short_repr(path)}: no such image file{hint}; check the path")
    kind = not_a_file(path)
    if kind is not None:
        raise ImageDecodingError(f"{short_repr(path)} is {kind}, not an image file; give the path of an image file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise ImageDecodingError(f"{short_repr(path)}: cannot be read ({err.strerror or err})") from None
    return _decode(io.BytesIO(data), short_repr(path))


def load_image(image: Any, timeout: float | None = None) -> Any:
    """`image` as an RGB `PIL` image: a local path, a URL, a base64 string, a `{"path", "bytes"}` record (a
    `datasets.Image(decode=False)` value), raw bytes or a `PIL` image.

    Args:
        image: the image or where it is.
        timeout (`float`, *optional*): seconds to wait for a URL.

    Raises:
        ImageDecodingError: one line naming the file (URL, record) and what is wrong.
    """
    if isinstance(image, os.PathLike):
        image = os.fspath(image)
    if isinstance(image, dict):
        path, data = image.get("path"), image.get("bytes")
        if data is None and path:
            return read_image_file(path)
        image = data if data is not None else image
    if isinstance(image, (bytes, bytearray)):
        return _decode(io.BytesIO(bytes(image)), "the image bytes")
    if isinstance(image, str):
        if image.startswith(("http://", "https://")):
            from transformers.image_utils import load_image as load_url

            try:
                return load_url(image, timeout=timeout)
            except Exception as err:  # httpx's and PIL's errors: no common type
                raise ImageDecodingError(f"{short_repr(image)}: cannot be read as an image ({err})") from None
        if not os.path.lexists(image):
            data = _base64_bytes(image)
            if data is not None:
                return _decode(io.BytesIO(data), "the base64 image")
        return read_image_file(image)
    from transformers.image_utils import load_image as load_pil  # a PIL image (or transformers' own type error)

    return load_pil(image, timeout=timeout)


__all__ = ["ImageDecodingError", "load_image", "read_image_file"]
