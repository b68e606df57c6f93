"""Files with a UTF-8 byte-order mark or in Latin-1 (issue 42, item 11): each works, or fails in one line naming
the file and saying it is not UTF-8, with the command that converts it, before anything is read or written.

- `ipu_config.json` and a JSON argument file (`python run_x.py args.json`), read by us: a BOM is harmless, Latin-1
  is one line;
- a model folder's `config.json`, `tokenizer.json`, `tokenizer_config.json` and `vocab.txt`, read by `transformers`
  (which fails on a BOM with "not a valid JSON file", or with a decoding error that names no file, or reads it into
  the first token of `vocab.txt`): one line naming the flag and the file, when the script's flags are parsed;
- a data file (`--train_file` CSV, JSON lines, text): a BOM is harmless (a text file's first line does not start
  with it), Latin-1 is one line naming the flag and the file (`datasets` raised `DatasetGenerationError` or a bare
  `UnicodeDecodeError`)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from types import SimpleNamespace

import pytest

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig

from ..conftest import REPO_ROOT
from ..helpers import load_script, one_clear_line, run_main

EXAMPLES = REPO_ROOT / "examples"
BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def run_glue():
    return load_script(EXAMPLES / "text-classification", "run_glue", "encodings")


@pytest.fixture(scope="module")
def run_clm():
    return load_script(EXAMPLES / "language-modeling", "run_clm", "encodings")


def _latin1(text: str) -> bytes:
    return text.encode("latin-1")


# ------------------------------------------------------------------ files we read: ipu_config.json, argument files
def test_an_ipu_config_with_a_bom_loads_and_one_in_latin1_is_one_line(tmp_path, reliability):
    text = json.dumps({"gradient_accumulation_steps": 4, "executable_cache_dir": "./caché"}, ensure_ascii=False)
    (tmp_path / "ipu_config.json").write_bytes(BOM + text.encode("utf-8"))
    assert IPUConfig.from_pretrained(tmp_path).executable_cache_dir == "./caché"
    (tmp_path / "ipu_config.json").write_bytes(_latin1(text))
    names = (str(tmp_path / "ipu_config.json"), "not UTF-8", "iconv -f latin1 -t utf-8")
    reliability.expect_clear_error(lambda: IPUConfig.from_pretrained(tmp_path), names, (IncompatibleIPUConfigError,))


def test_an_argument_file_with_a_bom_parses(run_glue, tmp_path):
    path = tmp_path / "args.json"
    values = {"model_name_or_path": "unused", "task_name": "sst2", "output_dir": str(tmp_path / "out"), "seed": 3}
    path.write_bytes(BOM + json.dumps(values).encode("utf-8"))
    saved, sys.argv = sys.argv, ["run_glue.py", str(path)]
    try:
        classes = (run_glue.ModelArguments, run_glue.DataTrainingArguments, run_glue.IPUTrainingArguments)
        parsed = run_glue.example_utils.parse_args(*classes)
    finally:
        sys.argv = saved
    assert parsed[2].seed == 3 and parsed[0].model_name_or_path == "unused"


def test_an_argument_file_in_latin1_is_one_line(run_glue, tmp_path, reliability):
    path = tmp_path / "args.json"
    path.write_bytes(_latin1(json.dumps({"model_name_or_path": "modèle", "output_dir": "out"}, ensure_ascii=False)))
    code, stderr = run_main(run_glue, [str(path)])
    one_clear_line(reliability, code, stderr, (str(path), "not UTF-8", "iconv -f latin1 -t utf-8"))


# ------------------------------------------------------------------ a model folder, read by transformers
MODEL_FILES = {  # each with a letter that Latin-1 writes in one byte, which is no UTF-8
    "config.json": json.dumps({"model_type": "bert", "label2id": {"négatif": 0}}, ensure_ascii=False),
    "tokenizer_config.json": json.dumps({"tokenizer_class": "BertTokenizer", "name": "modèle"}, ensure_ascii=False),
    "tokenizer.json": json.dumps({"version": "1.0", "added_tokens": [{"id": 0, "content": "é"}]}, ensure_ascii=False),
    "vocab.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\ncafé\n",
}


@pytest.mark.parametrize("damage", ["bom", "latin1"])
@pytest.mark.parametrize("name", sorted(MODEL_FILES))
def test_a_model_file_with_a_bom_or_in_latin1_is_one_line_naming_it(run_glue, tmp_path, reliability, name, damage):
    model = tmp_path / "model"
    model.mkdir()
    for file, text in MODEL_FILES.items():
        (model / file).write_text(text, encoding="utf-8")
    text = MODEL_FILES[name]
    (model / name).write_bytes(BOM + text.encode("utf-8") if damage == "bom" else _latin1(text))
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\na fine film\t1\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--model_name_or_path", str(model), "--task_name", "sst2", "--train_file", str(train), "--do_train"]
    code, stderr = run_main(run_glue, [*argv, "--output_dir", str(out), "--report_to", "none"])
    said = "byte-order mark" if damage == "bom" else "not UTF-8"
    one_clear_line(reliability, code, stderr, ("--model_name_or_path", name, said, str(model / name)))
    assert not out.exists()  # refused before anything was written


# ------------------------------------------------------------------ data files, read by datasets
DATA = {
    "csv": "sentence,label\nun film réussi,1\na dull film,0\n",
    "json": "".join(
        json.dumps(row, ensure_ascii=False) + "\n"
        for row in ({"sentence": "un film réussi", "label": 1}, {"sentence": "a dull film", "label": 0})
    ),
}


@pytest.mark.parametrize("fmt", sorted(DATA))
def test_a_data_file_in_latin1_is_one_line_naming_it(run_glue, tmp_path, reliability, fmt):
    path = tmp_path / f"train.{fmt}"
    path.write_bytes(_latin1(DATA[fmt]))
    out = tmp_path / "out"
    argv = ["--model_name_or_path", "unused", "--train_file", str(path), "--do_train", "--output_dir", str(out)]
    code, stderr = run_main(run_glue, argv)
    names = ("--train_file", str(path), "not UTF-8", "byte ", "0xE9", f"iconv -f latin1 -t utf-8 {path}")
    one_clear_line(reliability, code, stderr, names)
    assert not out.exists()


def test_a_text_file_in_latin1_is_one_line_naming_it(run_clm, tmp_path, reliability):
    path = tmp_path / "train.txt"
    path.write_bytes(_latin1("Il était une fois\nune histoire\n"))
    argv = ["--model_name_or_path", "unused", "--train_file", str(path), "--do_train", "--output_dir", str(tmp_path)]
    code, stderr = run_main(run_clm, argv)
    one_clear_line(reliability, code, stderr, ("--train_file", str(path), "not UTF-8", "iconv"))


@pytest.mark.parametrize("fmt", ["csv", "json", "txt"])
def test_a_data_file_with_a_bom_reads_as_without(tmp_path, fmt):
    """CSV and JSON lines as `datasets` reads them (`load_data_files`, `run_glue`), text as the language-modeling
    scripts read it: the first row is the same with a BOM as without (a text line no longer starts with U+FEFF)."""
    import example_utils
    from example_utils import language_modeling

    text = DATA.get(fmt, "Il était une fois\nune histoire\n")
    rows = {}
    for kind, data in (("plain", text.encode("utf-8")), ("bom", BOM + text.encode("utf-8"))):
        path = tmp_path / kind / f"train.{fmt}"
        path.parent.mkdir()
        path.write_bytes(data)
        if fmt == "txt":
            data_args = SimpleNamespace(dataset_name=None, train_file=str(path), validation_file=None)
            data_args.validation_split_percentage, data_args.keep_linebreaks = 50, True
            model_args = SimpleNamespace(cache_dir=str(tmp_path / kind / "cache"), token=None)
            raw = language_modeling.load_raw_datasets(data_args, model_args)
            rows[kind] = raw["validation"][0]
        else:
            raw = example_utils.load_data_files({"train": str(path)}, str(tmp_path / kind / "cache"))
            rows[kind] = raw["train"][0]
    assert rows["bom"] == rows["plain"] and not str(next(iter(rows["bom"].values()))).startswith("\ufeff")


def test_utf8_problem_names_the_byte_past_the_first_chunk(tmp_path):
    """A file is read in chunks: the byte is counted from the file's start, a character split between chunks is
    no error."""
    from optimum_ipu.files import utf8_problem

    path = tmp_path / "long.txt"
    path.write_bytes(("é" * 10).encode("utf-8") + b"\xe9 end")
    assert utf8_problem(path, chunk=3) is not None and "byte 20 is 0xE9" in utf8_problem(path, chunk=3)
    path.write_bytes(("é" * 10).encode("utf-8"))
    assert utf8_problem(path, chunk=3) is None
    path.write_bytes(BOM + b"{}")
    assert utf8_problem(path) is None and "byte-order mark" in utf8_problem(path, bom_allowed=False)


def test_run_glue_tsv_with_a_bom_reads_as_without(run_glue, tmp_path):
    path = tmp_path / "train.tsv"
    path.write_bytes(BOM + "sentence\tlabel\nun film réussi\t1\n".encode())
    rows = run_glue.read_glue_tsv(str(path), "sst2")
    assert rows.column_names[0] == "sentence" and rows[0]["sentence"] == "un film réussi"


@pytest.mark.parametrize("damage", ["bom", "latin1"])
def test_pipeline_and_config_check_name_a_model_file_that_is_not_utf8(tmp_path, reliability, damage):
    """The same model folders through `pipeline(model=DIR)` and `optimum-ipu config check --model DIR`, which got
    `transformers`' own words ("not a valid JSON file", naming neither the byte nor the fix)."""
    from optimum_ipu.cli import main as cli
    from optimum_ipu.pipelines import pipeline

    model = tmp_path / "model"
    model.mkdir()
    for file, text in MODEL_FILES.items():
        (model / file).write_text(text, encoding="utf-8")
    text = MODEL_FILES["config.json"]
    (model / "config.json").write_bytes(BOM + text.encode("utf-8") if damage == "bom" else _latin1(text))
    said = "byte-order mark" if damage == "bom" else "not UTF-8"
    names = (f"pipeline(model={str(model)!r})", "config.json", said)
    reliability.expect_clear_error(lambda: pipeline("text-classification", model=str(model)), names)
    err, config = io.StringIO(), str(REPO_ROOT / "optimum_ipu" / "ipu_configs" / "bert-base-ipu.json")
    with contextlib.redirect_stderr(err):
        code = cli(["config", "check", config, "--model", str(model)])
    one_clear_line(reliability, code, err.getvalue(), ("--model", "config.json", said))
