"""run_summarization.py end to end: T5 on the XSum fixture; ROUGE as upstream scores it (rouge-score, stemming)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..conftest import REPO_ROOT
from ..helpers import run_example

SUMMARIZATION_DIR = REPO_ROOT / "examples" / "summarization"
sys.path.insert(0, str(SUMMARIZATION_DIR))
from run_summarization import pick_column, rouge  # noqa: E402


def run_summarization(*args: str) -> subprocess.CompletedProcess:
    return run_example(SUMMARIZATION_DIR, "run_summarization.py", *args, timeout=600)


def test_train_evaluate_predict_on_the_xsum_sample(tmp_path, shared_data, tiny_pretrained):
    sample = str(shared_data / "fixtures" / "xsum" / "sample.json")
    out = tmp_path / "output"
    result = run_summarization(
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(tiny_pretrained("T5ForConditionalGeneration")),
        "--source_prefix",
        "summarize: ",
        "--train_file",
        sample,
        "--validation_file",
        sample,
        "--test_file",
        sample,
        "--max_predict_samples",
        "4",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--predict_with_generate",
        "--max_source_length",
        "64",
        "--max_target_length",
        "24",
        "--val_max_target_length",
        "12",
        "--per_device_train_batch_size",
        "2",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "3",
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
    scores = {"eval_rouge1", "eval_rouge2", "eval_rougeL", "eval_rougeLsum"}
    expected = {"train_loss", "train_samples_per_second", "eval_gen_len", "eval_loss", "predict_rougeLsum", *scores}
    assert expected <= set(everything), expected - set(everything)
    assert everything["train_samples"] == everything["eval_samples"] == 10 and everything["predict_samples"] == 4
    assert all(0 <= everything[key] <= 100 for key in scores) and 0 <= everything["eval_gen_len"] <= 12
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"  # drawn beside all_results.json
    assert len((out / "generated_predictions.txt").read_text().split("\n")) == 4
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 15  # 10 documents, batches of 2, 3 epochs
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 0.3, (first, last)


def test_a_missing_column_is_a_clear_error():
    with pytest.raises(ValueError, match="--text_column 'article' needs to be one of: document, summary"):
        pick_column("article", "document", ["document", "summary"], "--text_column")
    assert pick_column(None, "summary", ["document", "summary"], "--summary_column") == "summary"


def test_rouge_stems_and_splits_sentences_for_rougelsum():
    # Porter stemming: "the cats were running" and "a cat was runs" share "cat" and "run" (2 of 4 tokens each way)
    stemmed = rouge(["the cats were running"], ["a cat was runs"])
    assert stemmed["rouge1"] == pytest.approx(100 * 2 * (2 / 4 * 2 / 4) / (2 / 4 + 2 / 4))
    assert rouge(["Same words here."], ["Same words here."]) == pytest.approx(dict.fromkeys(stemmed, 100.0))
    # rougeL: one longest common subsequence over the whole text; rougeLsum: the union of LCS hits per sentence
    two = rouge(["bark dogs. cats sleep."], ["dogs bark. cats sleep."])
    assert two["rougeLsum"] == pytest.approx(75.0) and two["rougeL"] == pytest.approx(75.0)
    swapped = rouge(["cats sleep. dogs bark."], ["dogs bark. cats sleep."])
    assert swapped["rougeL"] == pytest.approx(50.0) and swapped["rougeLsum"] == pytest.approx(100.0)
