"""run_qa.py end to end: the reference command on the shared SQuAD articles with a tiny BERT."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest

from ..conftest import REPO_ROOT
from ..helpers import env, free_port, run_example, run_torchrun

QA_DIR = REPO_ROOT / "examples" / "question-answering"
sys.path.insert(0, str(QA_DIR))
import utils_qa  # noqa: E402

REFERENCE_FLAGS = (
    "--do_train --do_eval --overwrite_output_dir --per_device_train_batch_size 2 --per_device_eval_batch_size 2 "
    "--learning_rate 6e-5 --num_train_epochs 3 --max_seq_length 384 --doc_stride 128 --seed 1984 "
    "--lr_scheduler_type linear --loss_scaling 64 --weight_decay 0.01 --warmup_ratio 0.1"
).split()
REFERENCE_KEYS = {
    "epoch",
    "train_loss",
    "train_runtime",
    "train_samples",
    "train_samples_per_second",
    "train_steps_per_second",
    "eval_exact_match",
    "eval_f1",
    "eval_samples",
}


def run_qa(*args: str, torchrun: list[str] | None = None) -> subprocess.CompletedProcess:
    """`run_qa.py ARGS` in its folder; with `torchrun` (its options), under torchrun."""
    if torchrun is None:
        return run_example(QA_DIR, "run_qa.py", *args, timeout=900)
    return run_torchrun([*torchrun, "run_qa.py", *args], cwd=QA_DIR, env=env(), timeout=900)


def squad_files(shared_data) -> list[str]:
    path = str(shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json")
    return [
        "--train_file",
        path,
        "--train_articles",
        "0:34",
        "--validation_file",
        path,
        "--validation_articles",
        "34:40",
    ]


def test_reference_command_with_local_files(tmp_path, shared_data, tiny_qa_model_dir):
    out = tmp_path / "output"
    result = run_qa(
        "--ipu_config_name=./",
        "--model_name_or_path",
        str(tiny_qa_model_dir),
        *squad_files(shared_data),
        "--output_dir",
        str(out),
        *REFERENCE_FLAGS,
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "24",
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = {name: json.loads((out / f"{name}.json").read_text()) for name in ("train_results", "eval_results")}
    everything = json.loads((out / "all_results.json").read_text())
    assert REFERENCE_KEYS <= set(everything), REFERENCE_KEYS - set(everything)
    assert {"train_loss", "train_samples_per_second"} <= set(results["train_results"])
    assert {"eval_exact_match", "eval_f1"} <= set(results["eval_results"])
    assert everything["train_samples"] == 64 and everything["epoch"] == 3.0
    assert 0 <= everything["eval_exact_match"] <= everything["eval_f1"] <= 100
    assert (out / "ipu_config.json").is_file() and (out / "model.safetensors").is_file()
    predictions = json.loads((out / "eval_predictions.json").read_text())
    assert len(predictions) == 24
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"  # drawn beside all_results.json


def test_one_epoch_lowers_the_loss(tmp_path, shared_data, tiny_qa_model_dir):
    out = tmp_path / "output"
    result = run_qa(
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(tiny_qa_model_dir),
        *squad_files(shared_data),
        "--output_dir",
        str(out),
        "--do_train",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "2e-3",
        "--num_train_epochs",
        "1",
        "--max_seq_length",
        "128",
        "--doc_stride",
        "64",
        "--max_train_samples",
        "160",
        "--logging_steps",
        "1",
        "--seed",
        "3",
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    logged = [entry["loss"] for entry in history if "loss" in entry]
    assert len(logged) == 40
    first, last = sum(logged[:5]) / 5, sum(logged[-5:]) / 5
    assert last < first - 0.3, (first, last)


def test_dataset_name_offline_is_a_clear_error(tmp_path, tiny_qa_model_dir):
    result = run_qa(
        "--model_name_or_path",
        str(tiny_qa_model_dir),
        "--dataset_name",
        "squad",
        "--do_train",
        "--output_dir",
        str(tmp_path / "o"),
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert (
        "--dataset_name squad: not in the local datasets cache and the Hugging Face Hub could not be reached" in message
    )
    # one text for both users: how to download it with a network, which local files to give without one
    assert "With a network: unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE" in message
    assert "Without one: pass local files instead, --train_file" in message and "shared/" not in message
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_a_dataset_folder_without_data_is_reported_as_such(tmp_path, tiny_qa_model_dir):
    """Only the offline errors become the "cannot reach the Hub" message; anything else is `datasets`' own."""
    empty = tmp_path / "no-data-files"
    empty.mkdir()
    out = str(tmp_path / "o")
    result = run_qa(
        "--model_name_or_path", str(tiny_qa_model_dir), "--dataset_name", str(empty), "--do_eval", "--output_dir", out
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "Hugging Face Hub could not be reached" not in result.stderr and str(empty) in result.stderr


def test_dataset_name_reads_a_local_dataset_folder(tmp_path, shared_data, tiny_qa_model_dir):
    """The --dataset_name path end to end: `datasets.load_dataset(folder)` finds the splits by their file names."""
    path = shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json"
    folder = tmp_path / "my-squad"
    folder.mkdir()
    for split, articles in (("train", slice(0, 2)), ("validation", slice(34, 35))):
        utils_qa.load_squad_json(path, articles).to_json(folder / f"{split}.jsonl", force_ascii=False)
    out = tmp_path / "output"
    result = run_qa(
        "--model_name_or_path",
        str(tiny_qa_model_dir),
        "--dataset_name",
        str(folder),
        "--do_train",
        "--do_eval",
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "8",
        "--max_seq_length",
        "128",
        "--doc_stride",
        "64",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "8",
        "--num_train_epochs",
        "1",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    assert everything["train_samples"] == 16 and everything["eval_samples"] >= 8
    assert 0 <= everything["eval_exact_match"] <= everything["eval_f1"] <= 100
    assert len(json.loads((out / "eval_predictions.json").read_text())) == 8


def test_non_empty_output_dir_needs_overwrite(tmp_path, shared_data, tiny_qa_model_dir):
    out = tmp_path / "output"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    result = run_qa(
        "--model_name_or_path",
        str(tiny_qa_model_dir),
        *squad_files(shared_data),
        "--do_train",
        "--output_dir",
        str(out),
    )
    assert result.returncode != 0 and "Use --overwrite_output_dir to overcome" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"


def test_torchrun_pipeline_stages_give_the_single_process_results(tmp_path, shared_data, tiny_qa_model_dir):
    """`torchrun --nproc_per_node 2 run_qa.py` with 2 pipeline stages, each process loading only its stage: same
    loss, EM and F1 as one process."""
    # Dropout off: its random masks cannot follow the same random stream once stages run on two processes.
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_qa_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model_dir / "config.json").write_text(json.dumps(config))
    flags = [
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "layers_per_ipu=[1 1],ipus_per_replica=2,gradient_accumulation_steps=2,inference_device_iterations=1",
        "--model_name_or_path",
        str(model_dir),
        *squad_files(shared_data),
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "8",
        "--learning_rate",
        "1e-3",
        "--num_train_epochs",
        "1",
        "--max_seq_length",
        "128",
        "--doc_stride",
        "64",
        "--max_train_samples",
        "48",
        "--max_eval_samples",
        "16",
        "--seed",
        "5",
        "--report_to",
        "none",
        "--logging_steps",
        "1",
    ]
    single = run_qa(*flags, "--output_dir", str(tmp_path / "one"))
    assert single.returncode == 0, single.stderr[-3000:]
    torchrun = ["--nproc_per_node=2", f"--master_port={free_port()}"]
    pipelined = run_qa(*flags, "--output_dir", str(tmp_path / "two"), torchrun=torchrun)
    assert pipelined.returncode == 0, pipelined.stderr[-3000:]
    # each process built the model on the meta device and read only its stage (example_utils.load_pretrained)
    assert all(f"loading stage {i} of 2 only" in pipelined.stdout + pipelined.stderr for i in (0, 1))
    assert "loading stage" not in single.stdout + single.stderr
    one, two = (json.loads((tmp_path / d / "all_results.json").read_text()) for d in ("one", "two"))
    assert two["train_samples_per_second"] > 0
    for key in ("train_loss", "eval_exact_match", "eval_f1"):
        assert two[key] == pytest.approx(one[key], abs=1e-4), key


def test_packing_trains_on_packed_rows_and_evaluates_unpacked(tmp_path, shared_data, tiny_qa_model_dir):
    out = tmp_path / "packed"
    result = run_qa(
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(tiny_qa_model_dir),
        *squad_files(shared_data),
        "--output_dir",
        str(out),
        "--do_train",
        "--do_eval",
        "--packing",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "8",
        "--learning_rate",
        "1e-3",
        "--num_train_epochs",
        "1",
        "--max_seq_length",
        "256",
        "--doc_stride",
        "128",
        "--max_train_samples",
        "120",
        "--max_eval_samples",
        "16",
        "--report_to",
        "none",
        "--logging_steps",
        "1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "all_results.json").read_text())
    assert metrics["train_features"] == 120 and metrics["train_samples"] <= 120 / 1.5  # >= 1.5 features a row
    assert metrics["train_features_per_second"] > metrics["train_samples_per_second"] > 0
    assert 0 <= metrics["eval_exact_match"] <= metrics["eval_f1"] <= 100
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    logged = [entry["loss"] for entry in history if "loss" in entry]
    assert all(math.isfinite(loss) for loss in logged) and logged[-1] < logged[0]


def test_lora_adapters_train_and_evaluate(tmp_path, shared_data, tiny_qa_model_dir):
    """`--use_peft` (TRL's flags) on the MiniLM reader: the adapters and the span head train, evaluation runs through
    the adapted model, and the output folder holds peft's adapter files, the head included."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    out = tmp_path / "output"
    lora = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0"]
    result = run_qa(
        *lora,
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(tiny_qa_model_dir),
        *squad_files(shared_data),
        "--output_dir",
        str(out),
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "5e-3",
        "--num_train_epochs",
        "1",
        "--max_seq_length",
        "128",
        "--doc_stride",
        "64",
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "16",
        "--logging_steps",
        "1",
        "--seed",
        "3",
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    assert 0 <= everything["eval_exact_match"] <= everything["eval_f1"] <= 100
    names = {p.name for p in out.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json"} <= names and "model.safetensors" not in names
    adapters = load_file(out / "adapter_model.safetensors")
    assert any("lora_" in key for key in adapters) and any("qa_outputs" in key for key in adapters)
    assert json.loads((out / "adapter_config.json").read_text())["task_type"] == "QUESTION_ANS"
