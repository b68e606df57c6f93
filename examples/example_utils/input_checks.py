"""Checks of what the scripts' flags name, before anything is read: the text encodings of data files and model
folders, and the one line for a `--config_overrides` a config refused."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import transformers

from optimum_ipu.errors import elide, short_repr
from optimum_ipu.files import model_folder_text_problem, utf8_problem

# the flags that name a model's folder, whose JSON and text files `transformers` reads as UTF-8 without a BOM
MODEL_FOLDER_FLAGS = (
    "model_name_or_path",
    "config_name",
    "tokenizer_name",
    "feature_extractor_name",
    "image_processor_name",
    "processor_name",
)
# the data files a `--*_file` flag names that `datasets` (or a script) reads as UTF-8 text; compressed or binary
# files (.gz, .parquet, .arrow) are read by their own decoders
DATA_TEXT_FILES = (".csv", ".tsv", ".json", ".jsonl", ".txt", ".text", ".raw", ".tokens")


def check_text_encodings(*parsed: Any) -> None:
    """
    The text files the flags name, checked before anything reads them: a data file (`--train_file`, ... of a text
    format) must be UTF-8 (a byte-order mark is read as none); a local model folder's JSON and text files
    (`config.json`, `tokenizer.json`, `vocab.txt`, ...) must be UTF-8 without a byte-order mark, which
    `transformers` fails on ("not a valid JSON file", or a decoding error that names no file) or, in `vocab.txt`,
    reads into the first token. `ipu_config.json` is read with a BOM (`files.read_json_file`).

    Raises:
        `ValueError`: one line naming the flag, the file, the first byte that is not UTF-8 (or the BOM) and how to
            convert it (`iconv -f latin1 -t utf-8`).
    """
    for args in parsed:
        if isinstance(args, transformers.TrainingArguments):
            continue
        for name, value in vars(args).items():
            if not isinstance(value, str) or not value:
                continue
            if name.endswith("_file") and value.lower().endswith(DATA_TEXT_FILES) and os.path.isfile(value):
                problem = _utf8_problem(value, bom_allowed=True)
                if problem is not None:
                    raise ValueError(f"--{name} {value} {problem}")
            elif name in MODEL_FOLDER_FLAGS and os.path.isdir(value):
                problem = model_folder_text_problem(value)
                if problem is not None:
                    raise ValueError(f"--{name} {value}: {problem}")


def _utf8_problem(path: str, bom_allowed: bool) -> str | None:
    try:
        return utf8_problem(path, bom_allowed=bom_allowed)
    except OSError:  # unreadable: said by whatever reads it, with its own words
        return None


def overrides_error(overrides: str, err: Exception) -> ValueError:
    """The one line for `--config_overrides` that a config refused with `err`: the value (cut), and for a number
    past Python's limit on integer digits (whose own words name no key) the key that holds it and the limit."""
    limit = sys.get_int_max_str_digits()
    long_number = re.search(rf"([\w.]+)\"?\s*[=:]\s*[-+]?(\d{{{limit + 1},}})", overrides or "")
    if "integer string conversion" in str(err) and long_number:
        key, digits = long_number.group(1), len(long_number.group(2))
        return ValueError(
            f"--config_overrides: `{elide(key, 80)}` has a {digits}-digit number, over the {limit} digits Python reads "
            "as an integer; no config value needs one: give a smaller value"
        )
    return ValueError(f"--config_overrides {short_repr(overrides)}: {elide(' '.join(str(err).split()), 600)}")
