"""run_glue.py end to end on the shared GLUE TSV files: a tiny BERT on SST-2 (4 stages, and packed), a tiny GPT-2 on
MRPC."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest

from ..conftest import REPO_ROOT
from ..helpers import env, free_port, run_example, run_torchrun

GLUE_DIR = REPO_ROOT / "examples" / "text-classification"
TRAIN_KEYS = {"epoch", "train_loss", "train_runtime", "train_samples", "train_samples_per_second"}


def run_glue(*args: str) -> subprocess.CompletedProcess:
    return run_example(GLUE_DIR, "run_glue.py", *args, timeout=600)


def logged_losses(out) -> list[float]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


def test_sst2_tsv_with_bert(tmp_path, shared_data, tiny_pretrained):
    model = tiny_pretrained("BertForSequenceClassification", num_labels=2)
    out = tmp_path / "sst2"
    sst2 = shared_data / "glue" / "SST-2"
    # Graphcore's 4-stage BERT layout, bundled, cut for 4 layers: the stages run in turn in this process.
    layout = "layers_per_ipu=[0 1 1 2],inference_layers_per_ipu=[0 1 1 2],gradient_accumulation_steps=1"
    result = run_glue(
        "--ipu_config_name",
        "Graphcore/bert-base-ipu",
        "--ipu_config_overrides",
        layout,
        "--model_name_or_path",
        str(model),
        "--task_name",
        "sst2",
        "--train_file",
        str(sst2 / "train.tsv"),
        "--validation_file",
        str(sst2 / "dev.tsv"),
        "--do_train",
        "--do_eval",
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "96",
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "16",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "10",
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
    assert TRAIN_KEYS | {"eval_accuracy", "eval_loss", "eval_samples"} <= set(everything)
    assert "eval_f1" not in everything  # SST-2's GLUE metric is accuracy alone
    assert everything["train_samples"] == 64 and everything["eval_samples"] == 96
    assert 0.0 <= everything["eval_accuracy"] <= 1.0
    losses = logged_losses(out)  # 64 sentences, 4 steps an epoch, 10 epochs: the tiny model learns them
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.15, (first, last)
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert json.loads((out / "ipu_config.json").read_text())["layers_per_ipu"] == [0, 1, 1, 2]
    assert (out / "model.safetensors").is_file()
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_mrpc_tsv_with_gpt2_and_predict(tmp_path, shared_data, tiny_pretrained):
    model = tiny_pretrained("GPT2ForSequenceClassification", num_labels=2)
    out = tmp_path / "mrpc"
    mrpc = shared_data / "glue" / "MRPC"
    result = run_glue(
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=2",
        "--model_name_or_path",
        str(model),
        "--task_name",
        "mrpc",
        "--train_file",
        str(mrpc / "train.tsv"),
        "--validation_file",
        str(mrpc / "dev.tsv"),
        "--test_file",
        str(mrpc / "test.tsv"),
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--max_train_samples",
        "128",
        "--max_eval_samples",
        "64",
        "--max_predict_samples",
        "8",
        "--max_seq_length",
        "64",
        "--per_device_train_batch_size",
        "8",
        "--learning_rate",
        "2e-3",
        "--num_train_epochs",
        "2",
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
    assert TRAIN_KEYS | {"eval_accuracy", "eval_f1", "eval_combined_score"} <= set(everything)
    assert 0.0 <= everything["eval_accuracy"] <= 1.0 and 0.0 <= everything["eval_f1"] <= 1.0
    combined = (everything["eval_accuracy"] + everything["eval_f1"]) / 2
    assert everything["eval_combined_score"] == pytest.approx(combined)
    losses = logged_losses(out)
    assert len(losses) == 16 and all(loss == loss for loss in losses)  # 128 / (8 x 2) x 2 epochs, no NaN
    assert min(losses[-4:]) < losses[0]
    # GPT-2 has no padding token of its own: the script's must be the model's too.
    tokenizer = json.loads((out / "tokenizer_config.json").read_text())
    assert json.loads((out / "config.json").read_text())["pad_token_id"] is not None and tokenizer["pad_token"]
    lines = (out / "predict_results_mrpc.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 9
    assert {line.split("\t")[1] for line in lines[1:]} <= {"equivalent", "not_equivalent"}


def test_sst2_packing_trains_on_rows_and_evaluates_unpacked(tmp_path, shared_data, tiny_pretrained):
    model = tiny_pretrained("BertForSequenceClassification", num_labels=2)
    out = tmp_path / "packed"
    sst2 = shared_data / "glue" / "SST-2"
    result = run_glue(
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(model),
        "--task_name",
        "sst2",
        "--train_file",
        str(sst2 / "train.tsv"),
        "--validation_file",
        str(sst2 / "dev.tsv"),
        "--do_train",
        "--do_eval",
        "--packing",
        "--max_sequences_per_pack",
        "6",
        "--max_train_samples",
        "192",
        "--max_eval_samples",
        "64",
        "--max_seq_length",
        "64",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "16",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "3",
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
        "--log_level",
        "info",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    rows = everything["train_samples"]
    assert everything["train_features"] == 192 and 192 / 6 <= rows <= 192 / 2  # 2 to 6 sentences a row
    assert f"packing: 192 training features in {rows} rows of 64 tokens" in result.stdout
    assert everything["train_features_per_second"] > everything["train_samples_per_second"] > 0
    assert everything["eval_samples"] == 64 and 0.0 <= everything["eval_accuracy"] <= 1.0  # evaluated unpacked
    losses = logged_losses(out)
    assert len(losses) == 3 * (rows // 4) and all(math.isfinite(loss) for loss in losses)  # full batches of rows
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5  # the packed loss trains the model


@pytest.fixture(scope="module")
def run_glue_module():
    spec = importlib.util.spec_from_file_location("example_run_glue", GLUE_DIR / "run_glue.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_run_glue"] = module  # dataclasses resolve the string annotations through it
    spec.loader.exec_module(module)
    return module


def test_bad_task_name_and_missing_column_are_clear_errors(run_glue_module, shared_data, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"--task_name sst3: unknown GLUE task; pick one of cola, mnli, mrpc"):
        run_glue_module.DataTrainingArguments(task_name="sst3")
    # MRPC's columns read as SST-2: the error names the missing column and those the file has.
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "run_glue.py",
            "--model_name_or_path",
            "unused",
            "--task_name",
            "sst2",
            "--train_file",
            str(shared_data / "glue" / "MRPC" / "dev.tsv"),
            "--do_train",
            "--output_dir",
            str(tmp_path / "o"),
        ],
    )
    with pytest.raises(ValueError, match=r"no column sentence \(columns: label, #1 ID, #2 ID, sentence1, sentence2\)"):
        run_glue_module.main()


def test_glue_tsv_reading(run_glue_module, shared_data):
    """MRPC's TSV starts with a byte-order mark and has bare quotes: all 408 dev pairs come back, renamed."""
    dev = run_glue_module.read_glue_tsv(str(shared_data / "glue" / "MRPC" / "dev.tsv"), "mrpc")
    assert dev.column_names == ["label", "#1 ID", "#2 ID", "sentence1", "sentence2"] and len(dev) == 408
    assert set(dev.unique("label")) == {0, 1} and dev[0]["sentence2"].startswith('"The foodservice')
    sst2 = run_glue_module.read_glue_tsv(str(shared_data / "glue" / "SST-2" / "dev.tsv"), "sst2")
    assert sst2.column_names == ["sentence", "label"] and len(sst2) == 872


@pytest.mark.parametrize(
    "layout",
    ["layers_per_ipu=[2 2],ipus_per_replica=2,gradient_accumulation_steps=2", "tensor_parallel_size=2"],
    ids=["stages", "tensor-parallel"],
)
def test_torchrun_stages_evaluate_as_one_process(tmp_path, shared_data, tiny_pretrained, layout):
    """`torchrun --nproc_per_node 2 run_glue.py` with 2 pipeline stages (each batch forward through both processes),
    or each layer split over the 2 (`tensor_parallel_size=2`): classification trained and evaluated gives one process's
    loss and accuracy."""
    # Dropout off: its random masks cannot follow the same random stream once stages run on two processes.
    model = tiny_pretrained(
        "BertForSequenceClassification",
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        intermediate_size=36,  # split in two
    )
    sst2 = shared_data / "glue" / "SST-2"
    flags = ["--ipu_config_overrides", layout]
    flags += ["--model_name_or_path", str(model), "--task_name", "sst2"]
    flags += ["--train_file", str(sst2 / "train.tsv"), "--validation_file", str(sst2 / "dev.tsv")]
    flags += ["--do_train", "--do_eval", "--max_train_samples", "32", "--max_eval_samples", "40"]
    flags += ["--max_seq_length", "32", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8"]
    flags += ["--learning_rate", "3e-3", "--num_train_epochs", "1", "--seed", "0", "--report_to", "none"]
    single = run_glue(*flags, "--output_dir", str(tmp_path / "one"))
    assert single.returncode == 0, single.stderr[-3000:]
    torchrun = ["--nproc_per_node=2", f"--master_port={free_port()}"]
    args = [*torchrun, "run_glue.py", *flags, "--output_dir", str(tmp_path / "two")]
    staged = run_torchrun(args, cwd=GLUE_DIR, env=env(), timeout=600)
    assert staged.returncode == 0, staged.stderr[-3000:]
    one, two = (json.loads((tmp_path / d / "all_results.json").read_text()) for d in ("one", "two"))
    assert two["eval_samples"] == one["eval_samples"] == 40
    for key in ("train_loss", "eval_loss", "eval_accuracy"):
        assert two[key] == pytest.approx(one[key], abs=1e-4), key


def test_sst2_with_lora_adapters(tmp_path, shared_data, tiny_pretrained):
    """`--use_peft` (TRL's flags): the LoRA adapters and the new classifier head train, the base weights do not, and
    the output folder holds peft's adapter files, the head included."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    model = tiny_pretrained("BertForSequenceClassification", num_labels=2)
    out = tmp_path / "sst2-lora"
    sst2 = shared_data / "glue" / "SST-2"
    result = run_glue(
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_alpha",
        "8",
        "--lora_dropout",
        "0",
        "--lora_target_modules",
        "query",
        "value",
        "--model_name_or_path",
        str(model),
        "--task_name",
        "sst2",
        "--train_file",
        str(sst2 / "train.tsv"),
        "--validation_file",
        str(sst2 / "dev.tsv"),
        "--do_train",
        "--do_eval",
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "32",
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "16",
        "--learning_rate",
        "1e-2",
        "--num_train_epochs",
        "5",
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
    names = {p.name for p in out.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "eval_results.json"} <= names
    assert "model.safetensors" not in names
    adapters = load_file(out / "adapter_model.safetensors")
    assert any("lora_" in key for key in adapters) and any("classifier" in key for key in adapters)
    assert all("lora_" in key or "classifier" in key for key in adapters)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and sorted(config["target_modules"]) == ["query", "value"]
    losses = logged_losses(out)
    assert len(losses) == 20 and sum(losses[-5:]) < sum(losses[:5])
