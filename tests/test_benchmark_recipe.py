"""`optimum-ipu benchmark --mode recipe` (issue 26, item 1): the real SQuAD features it trains on are `run_qa.py`'s,
and one pair of runs (ours, then `transformers.Trainer`, each in its own process) gives the same loss and a ratio."""

from __future__ import annotations

import json
import sys

import pytest

from optimum_ipu.benchmark.recipe import training_features
from optimum_ipu.cli.main import main as cli

from .conftest import REPO_ROOT


def test_its_features_are_run_qas(shared_data, minilm_dir):
    import transformers

    sys.path.insert(0, str(REPO_ROOT / "examples" / "question-answering"))
    from utils_qa import load_squad_json, prepare_train_features

    squad = shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json"
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    examples = load_squad_json(squad, articles=slice(0, 3))
    want = prepare_train_features(examples[:], tokenizer, 256, 128, pad_to_max_length=True)
    got = training_features(tokenizer, len(want["input_ids"]), 256, squad)
    for column in ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions"):
        assert [feature[column] for feature in got] == want[column], column
    assert sum(s > 0 for s in want["start_positions"]) > len(got) / 2  # most windows hold their answer


def test_one_pair_trains_both_with_the_same_loss(tmp_path, tiny_pretrained, monkeypatch, capsys, shared_data):
    monkeypatch.setenv("OPTIMUM_IPU_SQUAD_FILE", str(shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json"))
    model = tiny_pretrained("BertForQuestionAnswering", num_labels=2)  # a start and an end logit
    flags = ["--model", str(model), "--seq-len", "64", "--batch-size", "4", "--steps", "3", "--warmup", "1"]
    assert cli(["benchmark", "--mode", "recipe", *flags, "--pairs", "1", "--output-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "benchmark.json").read_text())
    (pair,) = report["pairs"]
    assert pair["ours"]["loss"] == pytest.approx(pair["trainer"]["loss"], abs=1e-4)  # the same arithmetic
    assert all(pair[kind]["page_faults_per_step"] >= 0 for kind in ("ours", "trainer"))
    assert pair["ours_over_trainer"] == pytest.approx(pair["trainer"]["step_seconds"] / pair["ours"]["step_seconds"])
    assert "median ours / Trainer (speed)" in capsys.readouterr().out


def test_an_odd_batch_is_one_line(tmp_path, capsys):
    assert cli(["benchmark", "--mode", "recipe", "--batch-size", "5", "--output-dir", str(tmp_path)]) == 2
    assert "--batch-size 5: the recipe's steps are 2 micro-batches" in capsys.readouterr().err
