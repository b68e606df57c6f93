"""run_swag.py end to end on the shared SWAG fixture with a tiny BERT."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ..conftest import REPO_ROOT
from ..helpers import run_example

SWAG_DIR = REPO_ROOT / "examples" / "multiple-choice"


def run_swag(*args: str) -> subprocess.CompletedProcess:
    return run_example(SWAG_DIR, "run_swag.py", *args, timeout=600)


def test_swag_fixture_with_bert(tmp_path, shared_data, tiny_pretrained):
    model = tiny_pretrained("BertForMultipleChoice")
    sample = str(shared_data / "fixtures" / "swag" / "sample.json")
    out = tmp_path / "swag"
    result = run_swag(
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(model),
        "--train_file",
        sample,
        "--validation_file",
        sample,
        "--do_train",
        "--do_eval",
        "--max_seq_length",
        "48",
        "--per_device_train_batch_size",
        "2",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "6",
        "--logging_steps",
        "5",
        "--seed",
        "0",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    keys = {"eval_accuracy", "eval_loss", "eval_samples", "train_loss", "train_samples", "train_samples_per_second"}
    assert keys <= set(everything), keys - set(everything)
    assert everything["train_samples"] == 10 and everything["eval_samples"] == 10
    assert 0.0 <= everything["eval_accuracy"] <= 1.0
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.3, losses  # 5 steps per epoch, logged every 5
    assert (out / "ipu_config.json").is_file() and (out / "model.safetensors").is_file()
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_missing_column_is_a_clear_error(shared_data, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("example_run_swag", SWAG_DIR / "run_swag.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_run_swag"] = module  # dataclasses resolve the string annotations through it
    spec.loader.exec_module(module)
    conll = str(shared_data / "fixtures" / "conll" / "sample.json")  # not SWAG's layout
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "run_swag.py",
            "--model_name_or_path",
            "unused",
            "--train_file",
            conll,
            "--do_train",
            "--output_dir",
            str(tmp_path / "o"),
        ],
    )
    with pytest.raises(ValueError, match=r"the train data has no column sent1, sent2, ending0, .*label \(columns: "):
        module.main()
