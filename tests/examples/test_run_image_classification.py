"""run_image_classification.py end to end on the shared UCI digits (imagefolder): a tiny ViT on 2 pipeline stages and
a tiny ConvNeXt, both trained from a config."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ..conftest import REPO_ROOT
from ..helpers import run_example

SCRIPT_DIR = REPO_ROOT / "examples" / "image-classification"
TINY = {
    "vit": "image_size=16,patch_size=4,hidden_size=32,num_hidden_layers=4,num_attention_heads=2,intermediate_size=64",
    "convnext": json.dumps({"image_size": 32, "hidden_sizes": [16, 24, 32, 48], "depths": [1, 1, 1, 1]}),
}

SIDE = {"vit": 16, "convnext": 32}


def run_script(*args: str) -> subprocess.CompletedProcess:
    return run_example(SCRIPT_DIR, "run_image_classification.py", *args)


def logged_losses(out) -> list[float]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


@pytest.mark.parametrize("model_type", ["vit", "convnext"])
def test_digits_from_scratch(tmp_path, shared_data, model_type):
    digits = shared_data / "images" / "uci-digits-8x8"
    out = tmp_path / model_type
    result = run_script(
        "--ipu_config_name=./",
        "--model_type",
        model_type,
        "--config_overrides",
        TINY[model_type],
        "--train_dir",
        str(digits / "train"),
        "--validation_dir",
        str(digits / "validation"),
        "--do_train",
        "--do_eval",
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "40",
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "8",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "8",
        "--logging_steps",
        "1",
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
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"  # beside all_results.json
    expected = {"train_loss", "train_samples_per_second", "eval_loss", "eval_accuracy", "eval_samples"}
    assert expected <= set(everything), expected - set(everything)
    assert everything["train_samples"] == 64 and everything["eval_samples"] == 40
    assert 0.0 <= everything["eval_accuracy"] <= 1.0
    losses = logged_losses(out)  # 64 images, 8 x 2 accumulated (./ipu_config.json): 4 steps an epoch
    assert len(losses) == 32
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 0.2, (first, last)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type and config["id2label"]["7"] == "7"
    assert json.loads((out / "ipu_config.json").read_text())["layers_per_ipu"] == [-1, -1]
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert SIDE[model_type] in processor["size"].values()  # the family's processor, sized to the config


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location(
        "example_run_image_classification", SCRIPT_DIR / "run_image_classification.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_run_image_classification"] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def test_bad_arguments_are_clear_errors(script, shared_data, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"--train_dir .*nowhere: no such folder"):
        script.DataTrainingArguments(train_dir=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="give --dataset_name or --train_dir/--validation_dir"):
        script.DataTrainingArguments()
    with pytest.raises(ValueError, match="--model_type vitt: unknown to transformers"):
        script.ModelArguments(model_type="vitt")
    digits = shared_data / "images" / "uci-digits-8x8"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "run_image_classification.py",
            "--model_type",
            "vit",
            "--train_dir",
            str(digits / "train"),
            "--image_column_name",
            "img",
            "--do_train",
            "--output_dir",
            str(tmp_path / "o"),
        ],
    )
    with pytest.raises(
        ValueError,
        match=r"--image_column_name img: the train data has no such column \(columns: "
        r"image, label\)",
    ):
        script.main()
