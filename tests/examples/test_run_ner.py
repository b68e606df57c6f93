"""run_ner.py end to end on the shared CoNLL fixture with a tiny BERT; the seqeval metrics on known predictions."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from transformers import EvalPrediction

from ..conftest import REPO_ROOT
from ..helpers import run_example

NER_DIR = REPO_ROOT / "examples" / "token-classification"


def run_ner(*args: str) -> subprocess.CompletedProcess:
    return run_example(NER_DIR, "run_ner.py", *args, timeout=600)


def test_conll_fixture_with_bert(tmp_path, shared_data, tiny_pretrained):
    model = tiny_pretrained("BertForTokenClassification")  # 3 labels: the data's 6 need a new head
    sample = str(shared_data / "fixtures" / "conll" / "sample.json")
    out = tmp_path / "ner"
    result = run_ner(
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(model),
        "--ignore_mismatched_sizes",
        "--train_file",
        sample,
        "--validation_file",
        sample,
        "--test_file",
        sample,
        "--text_column_name",
        "words",
        "--label_column_name",
        "ner",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--max_seq_length",
        "64",
        "--per_device_train_batch_size",
        "2",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "8",
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
    keys = {"eval_precision", "eval_recall", "eval_f1", "eval_accuracy", "train_loss", "train_samples"}
    assert keys <= set(everything), keys - set(everything)
    assert everything["train_samples"] == 10 and everything["eval_samples"] == 10
    for key in ("eval_precision", "eval_recall", "eval_f1", "eval_accuracy"):
        assert 0.0 <= everything[key] <= 1.0, key
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.3, losses  # 5 steps per epoch, logged every 5
    # Labels are collected from the strings of the data, sorted; predictions.txt has one label per word.
    config = json.loads((out / "config.json").read_text())
    assert list(config["label2id"]) == ["B-LOC", "B-ORG", "B-PER", "I-LOC", "I-PER", "O"]
    words = [json.loads(line)["words"] for line in open(sample, encoding="utf-8")]
    predicted = (out / "predictions.txt").read_text().splitlines()
    assert [len(line.split()) for line in predicted] == [len(w) for w in words]
    assert {label for line in predicted for label in line.split()} <= set(config["label2id"])
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"


@pytest.fixture(scope="module")
def run_ner_module():
    spec = importlib.util.spec_from_file_location("example_run_ner", NER_DIR / "run_ner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_run_ner"] = module  # dataclasses resolve the string annotations through it
    spec.loader.exec_module(module)
    return module


def one_hot(ids: list[list[int]], classes: int) -> np.ndarray:
    return np.eye(classes)[np.array(ids)]


def test_seqeval_metrics_on_known_predictions(run_ner_module):
    labels = ["B-LOC", "B-PER", "I-PER", "O"]
    # Two sentences: [CLS] Bill Clinton in Paris [SEP] and [CLS] Rome [SEP] [PAD]; -100 on special tokens.
    gold = [[-100, 1, 2, 3, 0, -100], [-100, 0, -100, -100, -100, -100]]
    guess = [[3, 1, 2, 3, 3, 3], [3, 1, 3, 3, 3, 3]]  # PER found, both LOC missed, one wrong PER
    overall = run_ner_module.seqeval_metrics(labels, entity_level=False)(EvalPrediction(one_hot(guess, 4), gold))
    assert overall == pytest.approx({"precision": 1 / 2, "recall": 1 / 3, "f1": 0.4, "accuracy": 3 / 5})
    detailed = run_ner_module.seqeval_metrics(labels, entity_level=True)(EvalPrediction(one_hot(guess, 4), gold))
    assert detailed["overall_f1"] == pytest.approx(0.4)
    assert detailed["PER_precision"] == 0.5 and detailed["PER_recall"] == 1.0 and detailed["PER_number"] == 1
    assert detailed["LOC_recall"] == 0.0 and detailed["LOC_number"] == 2


def test_missing_column_is_a_clear_error(run_ner_module, shared_data, tmp_path, monkeypatch):
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "run_ner.py",
            "--model_name_or_path",
            "unused",
            "--train_file",
            str(shared_data / "fixtures" / "conll" / "sample.json"),
            "--label_column_name",
            "ner_tags",
            "--do_train",
            "--output_dir",
            str(tmp_path / "o"),
        ],
    )
    with pytest.raises(ValueError, match=r"--label_column_name ner_tags: the data has no such column \(columns: "):
        run_ner_module.main()
