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


def resample(waveform: np.ndarray, orig_sampling_rate: int, sampling_rate: int) -> np.ndarray:
    """`waveform` (samples on the last axis) from `orig_sampling_rate` to `sampling_rate` Hz, by polyphase
    filtering (`scipy.signal.resample_poly`: exact for integer ratios such as 8 kHz -> 16 kHz)."""
    if orig_sampling_rate == sampling_rate:
        return waveform
    if orig_sampling_rate <= 0 or sampling_rate <= 0:
        raise ValueError(f"sampling rates must be positive; got {orig_sampling_rate} -> {sampling_rate}")
    resample_poly = _resample_poly()
    common = gcd(int(orig_sampling_rate), int(sampling_rate))
    up, down = int(sampling_rate) // common, int(orig_sampling_rate) // common
    return resample_poly(waveform, up, down, axis=-1).astype(np.float32)


def read_audio(source: str | os.PathLike | bytes, sampling_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Decode an audio file (or its bytes) to mono float32 samples in [-1, 1].

    Args:
        source (`str`, `os.PathLike` or `bytes`): a WAV, FLAC or OGG file, or its content.
        sampling_rate (`int`, *optional*): resample to this rate (Hz); by default keep the file's.

    Returns:
        `(waveform, sampling_rate)`: a 1-D `np.float32` array (channels averaged) and its rate.

    Raises:
        `AudioDecodingError`: the file is missing or not a format libsndfile reads; the message names it.
    """
    soundfile = _soundfile()
    name = "<bytes>" if isinstance(source, bytes) else os.fspath(source)
    if not isinstance(source, bytes) and not os.path.isfile(name):
        raise AudioDecodingError(f"{name}: no such audio file")
    try:
        data, rate = soundfile.read(
            io.BytesIO(source) if isinstance(source, bytes) else name, dtype="float32", always_2d=True
        )
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as err:
        raise AudioDecodingError(
            f"{name}: cannot decode this audio ({err}); WAV, FLAC and OGG are read (through soundfile, without "
            "FFmpeg): convert it, e.g. `ffmpeg -i FILE out.wav` on a machine that has FFmpeg"
        ) from None
    waveform = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if sampling_rate is not None:
        waveform, rate = resample(waveform, rate, sampling_rate), sampling_rate
    return np.ascontiguousarray(waveform, dtype=np.float32), int(rate)


def load_audio(value: Any, sampling_rate: int) -> np.ndarray:
    """Mono float32 samples at `sampling_rate` from any of the forms audio takes in `datasets` and pipelines.

    Args:
        value: a file path; the bytes of a file; a dict with `"array"` (or `"raw"`) and `"sampling_rate"` (decoded
            `datasets` audio, `transformers`' pipeline input), resampled when its rate differs; a dict with `"path"`
            and/or `"bytes"` (`datasets`' `Audio(decode=False)`); or a 1-D `np.ndarray` / `torch.Tensor`, taken to be
            at `sampling_rate` already.
        sampling_rate (`int`): the rate the model's feature extractor expects (Hz).
    """
    if isinstance(value, (str, os.PathLike, bytes)):
        return read_audio(value, sampling_rate)[0]
    if isinstance(value, dict):
        array = value.get("array", value.get("raw"))
        if array is not None:
            if "sampling_rate" not in value:
                raise ValueError("an audio dict with 'array' (or 'raw') needs its 'sampling_rate' too")
            return resample(_mono(array), int(value["sampling_rate"]), sampling_rate)
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
        return _mono(value)
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
