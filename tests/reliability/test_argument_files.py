"""JSON argument files (`python run_qa.py args.json`) mean what the same flags mean on the command line: a boolean
given as a string is read as `--do_train false` reads it, and a value of the wrong type ends in one line naming the
file, the key, the value and the type wanted, exit code 2 (issue 28)."""

from __future__ import annotations

import json
import os

import pytest

from ..conftest import SHARED_DATA
from .test_script_errors import QA_DIR, load_script, one_clear_line, run_main

BASE = {"model_name_or_path": "unused", "train_file": str(SHARED_DATA / "squad" / "squad-v1.1-dev-articles-00-39.json")}


@pytest.fixture(scope="module")
def run_qa():
    return load_script(QA_DIR, "run_qa")


def parse(run_qa, tmp_path, monkeypatch, values: dict) -> tuple:
    path = tmp_path / "args.json"
    path.write_text(json.dumps({**BASE, "output_dir": str(tmp_path / "out"), **values}))
    monkeypatch.setattr("sys.argv", ["run_qa.py", str(path)])
    classes = (run_qa.example_utils.ModelArguments, run_qa.DataTrainingArguments, run_qa.IPUTrainingArguments)
    return run_qa.example_utils.parse_args(*classes, run_qa.PeftArguments)


@pytest.mark.parametrize(
    ("text", "meaning"), [("false", False), ("no", False), ("0", False), ("True", True), ("y", True)]
)
def test_boolean_strings_mean_what_the_command_line_reads(run_qa, tmp_path, monkeypatch, text, meaning):
    training_args = parse(run_qa, tmp_path, monkeypatch, {"do_train": text, "do_eval": not meaning})[2]
    assert (training_args.do_train, training_args.do_eval) == (meaning, not meaning)


def test_numbers_given_as_strings_convert_as_on_the_command_line(run_qa, tmp_path, monkeypatch):
    training_args = parse(run_qa, tmp_path, monkeypatch, {"learning_rate": "3e-5", "num_train_epochs": 2})[2]
    assert (training_args.learning_rate, training_args.num_train_epochs) == (3e-5, 2.0)


@pytest.mark.parametrize(
    ("key", "value", "wanted"),
    [
        ("do_train", "maybe", "boolean"),
        ("do_train", 1.5, "boolean"),
        ("learning_rate", "abc", "number"),
        ("learning_rate", True, "number"),
        ("num_train_epochs", [1, 2], "number"),
        ("max_seq_length", None, "integer"),
        ("max_seq_length", 3.5, "integer"),
        ("max_seq_length", {"a": 1}, "integer"),
        ("seed", "forty-two", "integer"),
    ],
)
def test_a_wrong_type_is_one_line_naming_key_value_and_type(run_qa, tmp_path, reliability, key, value, wanted):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({**BASE, "output_dir": str(tmp_path), key: value}))
    code, stderr = run_main(run_qa, [str(path)])
    one_clear_line(reliability, code, stderr, (str(path), repr(key), repr(value), wanted))


@pytest.mark.parametrize("kind", ["fifo", "deep", "not utf-8", "huge", "folder"])
def test_an_argument_file_gets_the_checks_of_an_ipu_config(run_qa, tmp_path, reliability, kind):
    """A FIFO blocked forever and a 100,000-deep file raised RecursionError (issue 42, item 7)."""
    path = tmp_path / "args.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "not utf-8":
        path.write_bytes(b'{"do_train": "\xff"}')
    else:
        path.write_text(json.dumps({**BASE, "output_dir": "x" * (2 << 20)}))
    code, stderr = run_main(run_qa, [str(path)])  # a FIFO would block: the read never starts
    wanted = {"fifo": "FIFO", "deep": "nested too deeply", "not utf-8": "not UTF-8", "huge": "over 1024 KiB"}
    one_clear_line(reliability, code, stderr, (str(path), wanted.get(kind, "a folder")))
