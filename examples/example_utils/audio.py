"""How the speech scripts read their audio (`run_audio_classification.py`, `run_speech_recognition_ctc.py`,
`run_speech_recognition_seq2seq.py`): `audiofolder` splits, or a dataset of the Hub (or its local cache) whose audio is
left undecoded, to be decoded by `soundfile` in the scripts' transforms (`datasets`' own decoding needs torchcodec and
FFmpeg).
"""

from __future__ import annotations

import os
from typing import Any

import datasets

import example_utils
from optimum_ipu.pipelines.audio import read_audio_folder

# `--dataset_name` out of reach: the local files the speech recognition scripts take instead
TRANSCRIPTIONS_HINT = (
    "--train_dir train --eval_dir test --text_column_name transcription (audiofolder layout: audio files, "
    "metadata.csv with file_name and the transcription)"
)


def undecoded(dataset: datasets.Dataset, audio_column: str) -> datasets.Dataset:
    """`dataset` with its `Audio` column (if it has one) left undecoded: decoded by the script's transform."""
    if isinstance(dataset.features.get(audio_column), datasets.Audio):
        return dataset.cast_column(audio_column, datasets.Audio(decode=False))
    return dataset


def read_audio_dirs(data_args: Any) -> dict[str, datasets.Dataset]:
    """The `train` / `eval` splits of `--train_dir` / `--eval_dir`, `audiofolder` folders (those given)."""
    dirs = {"train": data_args.train_dir, "eval": data_args.eval_dir}
    for split, path in dirs.items():
        if path and not os.path.isdir(path):
            raise FileNotFoundError(f"--{split}_dir {path}: no such folder")
    return {split: read_audio_folder(path, data_args.audio_column_name) for split, path in dirs.items() if path}


def load_transcribed_splits(data_args: Any, model_args: Any) -> dict[str, datasets.Dataset]:
    """The `train` / `eval` splits, from `audiofolder` folders or the Hub or its local cache (`--train_split_name`
    and `--eval_split_name`, each one split or several joined by `+`), audio left undecoded."""
    if data_args.dataset_name is None:
        return read_audio_dirs(data_args)
    out = {}
    for split, names in (("train", data_args.train_split_name), ("eval", data_args.eval_split_name)):
        parts = [
            example_utils.load_hub_dataset(
                data_args.dataset_name,
                data_args.dataset_config_name,
                local_files_hint=TRANSCRIPTIONS_HINT,
                split=name,
                cache_dir=model_args.cache_dir,
                token=model_args.token,
            )
            for name in names.split("+")
        ]
        out[split] = undecoded(datasets.concatenate_datasets(parts), data_args.audio_column_name)
    return out
