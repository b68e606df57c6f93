"""run_translation.py end to end: T5 on the WMT16 en-ro fixture (JSON lines) and the real aligned newstest2016 files."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from ..conftest import REPO_ROOT
from ..helpers import run_example

TRANSLATION_DIR = REPO_ROOT / "examples" / "translation"
sys.path.insert(0, str(TRANSLATION_DIR))
from run_translation import load_translation_file  # noqa: E402


def run_translation(*args: str) -> subprocess.CompletedProcess:
    return run_example(TRANSLATION_DIR, "run_translation.py", *args, timeout=600)


def test_train_evaluate_predict_on_fixture_and_aligned_files(tmp_path, shared_data, tiny_pretrained):
    fixture = shared_data / "fixtures" / "wmt_en_ro"
    out = tmp_path / "output"
    result = run_translation(
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(tiny_pretrained("T5ForConditionalGeneration")),
        "--source_lang",
        "en",
        "--target_lang",
        "ro",
        "--source_prefix",
        "translate English to Romanian: ",
        "--train_file",
        str(fixture / "train.json"),
        "--validation_file",
        str(shared_data / "wmt16_en_ro" / "newstest2016-enro"),
        "--test_file",
        str(fixture / "test.json"),
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--predict_with_generate",
        "--num_beams",
        "2",
        "--max_eval_samples",
        "8",
        "--max_predict_samples",
        "6",
        "--max_source_length",
        "48",
        "--max_target_length",
        "32",
        "--val_max_target_length",
        "16",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "8",
        "--logging_steps",
        "1",
        "--seed",
        "3",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    expected = {
        "train_loss",
        "train_samples_per_second",
        "eval_bleu",
        "eval_gen_len",
        "eval_loss",
        "eval_samples",
        "predict_bleu",
        "predict_gen_len",
    }
    assert expected <= set(everything), expected - set(everything)
    assert everything["train_samples"] == 11 and everything["eval_samples"] == 8
    assert 0 <= everything["eval_bleu"] <= 100 and 0 <= everything["eval_gen_len"] <= 16
    assert {"eval_bleu", "eval_gen_len"} <= set(json.loads((out / "eval_results.json").read_text()))
    assert len((out / "generated_predictions.txt").read_text().split("\n")) == 6
    assert (out / "ipu_config.json").is_file() and (out / "model.safetensors").is_file()
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"  # drawn beside all_results.json
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 16  # 11 examples, full batches of 4: 2 steps an epoch
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 0.3, (first, last)


def test_aligned_files_load_as_hf_translation_examples(shared_data):
    examples = load_translation_file(str(shared_data / "wmt16_en_ro" / "newsdev2016-enro"), "en", "ro")
    assert len(examples) == 1999 and examples.column_names == ["translation"]
    with gzip.open(shared_data / "wmt16_en_ro" / "newsdev2016-enro.ro.gz", "rt", encoding="utf-8") as f:
        assert examples[0]["translation"]["ro"] == f.readline().rstrip("\n")
    fixture = load_translation_file(str(shared_data / "fixtures" / "wmt_en_ro" / "val.json"), "en", "ro")
    assert len(fixture) == 16 and set(fixture[0]["translation"]) == {"en", "ro"}


def test_bad_translation_files_are_clear_errors(tmp_path, shared_data):
    (tmp_path / "pair.en").write_text("one\ntwo\n")
    (tmp_path / "pair.ro").write_text("unu\n")
    with pytest.raises(ValueError, match="pair.en has 2 lines but .*pair.ro has 1: they must be aligned"):
        load_translation_file(str(tmp_path / "pair"), "en", "ro")
    with pytest.raises(FileNotFoundError, match="missing: no such file, nor the prefix of aligned files"):
        load_translation_file(str(tmp_path / "missing"), "en", "ro")
    with pytest.raises(ValueError, match=r"line 1: expected \{'translation': \{'en': ..., 'de': ...\}\}"):
        load_translation_file(str(shared_data / "fixtures" / "wmt_en_ro" / "val.json"), "en", "de")
