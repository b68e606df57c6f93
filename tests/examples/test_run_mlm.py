"""run_mlm.py end to end on the real WikiText-2 files (valid to train, test to evaluate): a tiny RoBERTa on
concatenated blocks with a serialized projection, and a tiny BERT line by line, padded to a static length."""

from __future__ import annotations

import json
import math

import pytest

from ..conftest import REPO_ROOT
from ..helpers import run_example

LM_DIR = REPO_ROOT / "examples" / "language-modeling"


def run_script(script: str, *args: str) -> None:
    run = run_example(LM_DIR, script, *args)
    assert run.returncode == 0, run.stderr[-3000:]


def check_results(out, steps: int, train_samples: int, eval_samples: int) -> dict:
    everything = json.loads((out / "all_results.json").read_text())
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"  # beside all_results.json
    expected = {
        "train_loss",
        "train_samples",
        "train_samples_per_second",
        "eval_loss",
        "eval_accuracy",
        "eval_samples",
        "perplexity",
    }
    assert expected <= set(everything), expected - set(everything)
    assert {"eval_loss", "perplexity"} <= set(json.loads((out / "eval_results.json").read_text()))
    assert everything["perplexity"] == pytest.approx(math.exp(everything["eval_loss"]), rel=1e-9)
    assert everything["train_samples"] == train_samples and everything["eval_samples"] == eval_samples
    assert 0.0 <= everything["eval_accuracy"] <= 1.0
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == steps
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.3, (first, last)
    return everything


def test_roberta_blocks_and_bert_line_by_line_train_on_wikitext(tmp_path, shared_data, tiny_pretrained):
    folder = shared_data / "wikitext2_tokens"
    files = ["--train_file", str(folder / "wiki.valid.tokens"), "--validation_file", str(folder / "wiki.test.tokens")]
    common = [
        *files,
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "1",
        "--logging_steps",
        "1",
        "--seed",
        "3",
        "--max_seq_length",
        "32",
        "--max_eval_samples",
        "24",
        "--report_to",
        "none",
    ]
    roberta_out, bert_out = tmp_path / "roberta", tmp_path / "bert"
    run_script(
        "run_mlm.py",
        "--model_name_or_path",
        str(tiny_pretrained("RobertaForMaskedLM")),
        "--ipu_config_name",
        "./ipu_config_roberta.json",
        "--ipu_config_overrides",
        "projection_serialization_factor=2,gradient_accumulation_steps=1",
        "--max_train_samples",
        "128",
        "--mlm_probability",
        "0.3",
        "--output_dir",
        str(roberta_out),
        *common,
    )
    run_script(
        "run_mlm.py",
        "--model_name_or_path",
        str(tiny_pretrained("BertForMaskedLM")),
        "--ipu_config_name",
        "./ipu_config_roberta.json",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--line_by_line",
        "--pad_to_max_length",
        "--max_train_samples",
        "96",
        "--mlm_probability",
        "0.3",
        "--output_dir",
        str(bert_out),
        *common,
    )

    check_results(roberta_out, steps=32, train_samples=128, eval_samples=24)
    saved = json.loads((roberta_out / "ipu_config.json").read_text())
    assert saved["projection_serialization_factor"] == 2 and saved["recompute_checkpoint_every_layer"] is True

    check_results(bert_out, steps=24, train_samples=96, eval_samples=24)
    assert json.loads((bert_out / "ipu_config.json").read_text())["projection_serialization_factor"] == 1


def test_roberta_with_lora_adapters(tmp_path, shared_data, tiny_pretrained):
    """`--use_peft` on a masked LM (no peft task type: the plain PeftModel), with the projection serialized as the
    RoBERTa config has it: only the adapters are saved, as peft's files."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    folder = shared_data / "wikitext2_tokens"
    out = tmp_path / "roberta-lora"
    run_script(
        "run_mlm.py",
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_dropout",
        "0",
        "--model_name_or_path",
        str(tiny_pretrained("RobertaForMaskedLM")),
        "--ipu_config_name",
        "./ipu_config_roberta.json",
        "--ipu_config_overrides",
        "projection_serialization_factor=2,gradient_accumulation_steps=1",
        "--train_file",
        str(folder / "wiki.valid.tokens"),
        "--validation_file",
        str(folder / "wiki.test.tokens"),
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "1e-2",
        "--num_train_epochs",
        "1",
        "--max_seq_length",
        "32",
        "--max_train_samples",
        "32",
        "--max_eval_samples",
        "8",
        "--seed",
        "3",
        "--report_to",
        "none",
        "--output_dir",
        str(out),
    )
    names = {p.name for p in out.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "eval_results.json"} <= names
    assert "model.safetensors" not in names
    adapters = load_file(out / "adapter_model.safetensors")
    assert adapters and all("lora_" in key for key in adapters)
