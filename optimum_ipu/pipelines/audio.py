"""Audio decoding without system libraries: WAV, FLAC and OGG through `soundfile` (its wheel bundles libsndfile),
resampling through `scipy.signal.resample_poly`, and the `audiofolder` layout read from its `metadata.csv`.

`datasets` 5 decodes its `Audio` feature with torchcodec and FFmpeg, and `transformers`' pipelines read files with
the `ffmpeg` program; a clean machine has neither. The example scripts and the audio pipelines decode here instead:

```python
>>> from optimum_ipu.pipelines.audio import load_audio, read_audio_folder
>>> waveform = load_audio("speech.flac", sampling_rate=16_000)   # mono float32 at 16 kHz
>>> train = read_audio_folder("fsdd/train")                       # metadata.csv + an `audio` column of file paths
>>> load_audio(train[0]["audio"], sampling_rate=16_000)
```
"""

from __future__ import annotations

import io
import os
from math import gcd
from typing import Any

import numpy as np

from ..errors import positive_int_setting

METADATA_FILES = ("metadata.csv", "metadata.jsonl")


class AudioDecodingError(ValueError):
    """An audio file (or bytes) that cannot be decoded; the message names the file and what is readable."""


AUDIO_EXTRA = 'pip install "optimum-ipu[audio]"'


def _soundfile() -> Any:
    try:
        import soundfile
    except ImportError as err:
        raise ImportError(f"decoding audio needs soundfile, in the [audio] extra: {AUDIO_EXTRA}") from err
    return soundfile


def _resample_poly() -> Any:
    try:
        from scipy.signal import resample_poly
    except ImportError as err:
        raise ImportError(f"resampling audio needs scipy, in the [audio] extra: {AUDIO_EXTRA}") from err
    return resample_poly


# The sample rates a file may claim (Hz): from telephone-band recordings well below 8 kHz to 384 kHz studio audio. A
# header outside them is damaged or mislabeled, and resampling it would allocate up to billions of samples.
MIN_SAMPLING_RATE = 1_000
MAX_SAMPLING_RATE = 384_000
MAX_RESAMPLED_SAMPLES = 2**28  # 1 GiB of float32 (4.6 hours at 16 kHz), bounded before resampling allocates it
# Samples (frames x channels) decoded at most (settable), checked from the header before decoding: a 476 KB FLAC
# can hold 8 channels of 5 minutes at 192 kHz, 1.7 GiB once decoded
MAX_SAMPLES_VARIABLE = "OPTIMUM_IPU_MAX_AUDIO_SAMPLES"
DEFAULT_MAX_DECODED_SAMPLES = 2**27  # 512 MiB of float32: 70 minutes of 16 kHz stereo
MIN_DURATION_S = 0.01  # a clip shorter than 10 ms has nothing any speech or audio model can read (nor an empty one)
FIX_RATE = "re-encode it at its true rate (e.g. soundfile.write('fixed.wav', samples, TRUE_RATE))"


def check_sampling_rate(rate: Any, name: str = "the waveform") -> int:
    """`rate` as an int, or `AudioDecodingError` naming `name` if it is outside `MIN_SAMPLING_RATE` and
    `MAX_SAMPLING_RATE` (a damaged or mislabeled header: it would drive resampling to absurd sizes)."""
    try:
        value = int(rate)
    except (TypeError, ValueError, OverflowError):
        value = None
    if value is None or value != rate or not MIN_SAMPLING_RATE <= value <= MAX_SAMPLING_RATE:
        raise AudioDecodingError(
            f"{name}: a sampling rate of {rate!r} Hz is outside {MIN_SAMPLING_RATE}..{MAX_SAMPLING_RATE} Hz (a "
            f"damaged or mislabeled header); {FIX_RATE}"
        )
    return value


def check_samples(waveform: np.ndarray, rate: int, name: str = "the waveform") -> np.ndarray:
    """`waveform` if its samples are finite and last at least `MIN_DURATION_S`, or `AudioDecodingError` naming `name`.

    NaN or Inf samples would give NaN scores, an empty transcript or a NaN training loss that blames the learning
    rate; an empty or near-empty clip would be classified like silence. `transformers`' pipelines take both without
    a word (an empty array is padded to silence, or fails deep in a convolution), so both are refused here, once, by
    the file's name.
    """
    if waveform.size and not np.isfinite(waveform).all():
        bad = int(np.size(waveform) - np.count_nonzero(np.isfinite(waveform)))
        raise AudioDecodingError(
            f"{name}: {bad} of its {waveform.size} samples are NaN or infinite (a damaged or wrongly converted file); "
            "re-export it from its source, or replace the samples (np.nan_to_num) if the rest is sound"
        )
    if waveform.shape[-1] < MIN_DURATION_S * rate:
        raise AudioDecodingError(
            f"{name}: {waveform.shape[-1]} samples at {rate} Hz is shorter than {MIN_DURATION_S * 1000:g} ms (empty or "
            "truncated); drop it from the data or give a longer clip"
        )
    return waveform


def resample(
    waveform: np.ndarray, orig_sampling_rate: int, sampling_rate: int, name: str = "the waveform"
) -> np.ndarray:
    """`waveform` (samples on the last axis) from `orig_sampling_rate` to `sampling_rate` Hz, by polyphase
    filtering (`scipy.signal.resample_poly`: exact for integer ratios such as 8 kHz -> 16 kHz).

    Raises:
        `AudioDecodingError` (a `ValueError`): a rate outside `MIN_SAMPLING_RATE`..`MAX_SAMPLING_RATE`, or a result
        over `MAX_RESAMPLED_SAMPLES`, checked before anything is allocated; the message names `name`.
    """
    if orig_sampling_rate == sampling_rate:
        return waveform
    orig_sampling_rate = check_sampling_rate(orig_sampling_rate, name)
    sampling_rate = check_sampling_rate(sampling_rate, f"{name} (the rate asked for)")
    common = gcd(orig_sampling_rate, sampling_rate)
    up, down = sampling_rate // common, orig_sampling_rate // common
    length = -(-waveform.shape[-1] * up // down)
    if length * max(1, waveform.size // max(1, waveform.shape[-1])) > MAX_RESAMPLED_SAMPLES:
        raise AudioDecodingError(
            f"{name}: {waveform.shape[-1]} samples at {orig_sampling_rate} Hz would be {length} at {sampling_rate} Hz, "
            f"over {MAX_RESAMPLED_SAMPLES}; cut it into shorter clips, or {FIX_RATE} if its rate is wrong"
        )
    resample_poly = _resample_poly()
    return resample_poly(waveform, up, down, axis=-1).astype(np.float32)


def read_audio(source: str | os.PathLike | bytes, sampling_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Decode an audio file (or its bytes) to mono float32 samples in [-1, 1].

    Args:
        source (`str`, `os.PathLike` or `bytes`): a WAV, FLAC or OGG file, or its content.
        sampling_rate (`int`, *optional*): resample to this rate (Hz); by default keep the file's.

    Returns:
        `(waveform, sampling_rate)`: a 1-D `np.float32` array (channels averaged) and its rate.

    Raises:
        `AudioDecodingError` (a `ValueError`): the file is missing or not a format libsndfile reads, its header
        claims a rate outside `MIN_SAMPLING_RATE`..`MAX_SAMPLING_RATE`, a sample is NaN or infinite, or it lasts
        under `MIN_DURATION_S` (an empty clip included); the message names the file and the fix.
    """
    soundfile = _soundfile()
    name = "<bytes>" if isinstance(source, bytes) else os.fspath(source)
    if not isinstance(source, bytes) and not os.path.isfile(name):
        raise AudioDecodingError(f"{name}: no such audio file")
    try:
        with soundfile.SoundFile(io.BytesIO(source) if isinstance(source, bytes) else name) as file:
            rate = check_sampling_rate(file.samplerate, name)  # before a damaged header drives any allocation
            check_decoded_size(file.frames, file.channels, rate, name)
            data = file.read(dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as err:
        claimed = _wav_header_rate(source)  # libsndfile refuses a rate over 2^31 without saying which field
        if claimed is not None:
            check_sampling_rate(claimed, name)
        raise AudioDecodingError(
            f"{name}: cannot decode this audio ({err}); WAV, FLAC and OGG are read (through soundfile, without "
            "FFmpeg): convert it, e.g. `ffmpeg -i FILE out.wav` on a machine that has FFmpeg"
        ) from None
    waveform = check_samples(data.mean(axis=1) if data.shape[1] > 1 else data[:, 0], rate, name)
    if sampling_rate is not None:
        waveform, rate = resample(waveform, rate, sampling_rate, name), sampling_rate
    return np.ascontiguousarray(waveform, dtype=np.float32), int(rate)


def max_decoded_samples() -> int:
    """The most samples (frames x channels) a file may decode to: `OPTIMUM_IPU_MAX_AUDIO_SAMPLES`, else 2^27."""
    return positive_int_setting(MAX_SAMPLES_VARIABLE, DEFAULT_MAX_DECODED_SAMPLES)


def check_decoded_size(frames: int, channels: int, rate: int, name: str) -> None:
    """Refuse a file whose header claims more samples than `max_decoded_samples()`, before decoding any."""
    limit = max_decoded_samples()
    if frames * channels > limit:
        raise AudioDecodingError(
            f"{name}: {channels} channel(s) of {frames / rate / 60:.1f} minutes at {rate} Hz decode to "
            f"{frames * channels * 4 / 2**30:.1f} GiB, over the limit of {limit} samples; cut or downmix it, or "
            f"raise {MAX_SAMPLES_VARIABLE}"
        )


def _wav_header_rate(source: str | bytes) -> int | None:
    """The sample rate a RIFF/WAVE header claims (its `fmt ` chunk, within the first 4 KiB), or None."""
    try:
        if isinstance(source, bytes):
            head = source[:4096]
        else:
            with open(source, "rb") as file:
                head = file.read(4096)
    except OSError:
        return None
    at = head.find(b"fmt ") if head[:4] == b"RIFF" and head[8:12] == b"WAVE" else -1
    if at < 0 or len(head) < at + 16:
        return None
    return int.from_bytes(head[at + 12 : at + 16], "little")


def load_audio(value: Any, sampling_rate: int) -> np.ndarray:
    """Mono float32 samples at `sampling_rate` from any of the forms audio takes in `datasets` and pipelines.

    Args:
        value: a file path; the bytes of a file; a dict with `"array"` (or `"raw"`) and `"sampling_rate"` (decoded
            `datasets` audio, `transformers`' pipeline input), resampled when its rate differs; a dict with `"path"`
            and/or `"bytes"` (`datasets`' `Audio(decode=False)`); or a 1-D `np.ndarray` / `torch.Tensor`, taken to be
            at `sampling_rate` already.
        sampling_rate (`int`): the rate the model's feature extractor expects (Hz).

    Raises:
        `AudioDecodingError` (a `ValueError`): as `read_audio` for a file (naming it); for an array, the same checks
        of its rate, its samples (NaN or Inf) and its length (under `MIN_DURATION_S`, empty included), naming "the
        waveform". `transformers`' pipelines take an empty or NaN waveform without a word; here it is one error.
    """
    if isinstance(value, (str, os.PathLike, bytes)):
        return read_audio(value, sampling_rate)[0]
    if isinstance(value, dict):
        array = value.get("array", value.get("raw"))
        if array is not None:
            if "sampling_rate" not in value:
                raise ValueError("an audio dict with 'array' (or 'raw') needs its 'sampling_rate' too")
            rate = check_sampling_rate(value["sampling_rate"])
            return resample(check_samples(_mono(array), rate), rate, sampling_rate)
        if value.get("bytes") is not None:
            return read_audio(value["bytes"], sampling_rate)[0]
        if value.get("path") is not None:
            return read_audio(value["path"], sampling_rate)[0]
        raise ValueError(
            f"an audio dict needs 'array' and 'sampling_rate', 'bytes' or 'path'; got keys {sorted(value)}"
        )
    if hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return check_samples(_mono(value), sampling_rate)
    raise TypeError(f"audio: got a {type(value).__name__}; expected a file path, bytes, a dict or a 1-D array")


def _mono(array: Any) -> np.ndarray:
    array = np.asarray(array, dtype=np.float32)
    if array.ndim == 2:  # (channels, samples), as transformers' pipelines take multi-channel audio
        array = array.mean(axis=0)
    if array.ndim != 1:
        raise ValueError(f"audio: expected 1-D samples (or channels x samples); got shape {array.shape}")
    return array


def read_audio_folder(folder: str | os.PathLike, audio_column: str = "audio") -> Any:
    """A `datasets.Dataset` of an `audiofolder` split: the rows of its `metadata.csv` (or `metadata.jsonl`), whose
    `file_name` column becomes `audio_column`, holding each file's full path (decode with `load_audio`).

    Args:
        folder (`str` or `os.PathLike`): the split's folder (audio files and the metadata file side by side, or in
            sub-folders that `file_name` names).
        audio_column (`str`, *optional*, defaults to `"audio"`): the name of the column of file paths.

    Raises:
        `FileNotFoundError` / `ValueError`: no metadata file, no `file_name` column, or a listed file that is not
        there (the first missing one is named).
    """
    try:
        import datasets  # an optional dependency: only the scripts that read folders need it
    except ImportError as error:
        raise ImportError(
            "read_audio_folder needs the `datasets` package: pip install 'optimum-ipu[examples]'"
        ) from error

    folder = os.fspath(folder)
    found = [os.path.join(folder, n) for n in METADATA_FILES if os.path.isfile(os.path.join(folder, n))]
    if not found:
        raise FileNotFoundError(
            f"{folder}: no {' or '.join(METADATA_FILES)}; an audiofolder split lists its files "
            "there (a 'file_name' column and the labels)"
        )
    metadata = found[0]
    builder = "csv" if metadata.endswith(".csv") else "json"
    rows = datasets.load_dataset(builder, data_files={"split": metadata}, split="split")
    if "file_name" not in rows.column_names:
        raise ValueError(f"{metadata}: no 'file_name' column (columns: {', '.join(rows.column_names)})")
    paths = [os.path.join(folder, name) for name in rows["file_name"]]
    missing = next((p for p in paths if not os.path.isfile(p)), None)
    if missing is not None:
        raise FileNotFoundError(f"{metadata} lists {missing}, which is not there")
    return rows.remove_columns("file_name").add_column(audio_column, paths)
