"""run_audio_classification.py end to end on the shared Free Spoken Digit Dataset (8 kHz WAV, read from its
metadata.csv and resampled to 16 kHz): a tiny Wav2Vec2 and a tiny HuBERT trained from a config, and the pretrained
Whisper tiny.en encoder with a new head."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ..conftest import REPO_ROOT
from ..helpers import fsdd_subset, half_precision_flags, run_example, run_flags

SCRIPT_DIR = REPO_ROOT / "examples" / "audio-classification"
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "conv_dim": [16, 16, 16],
    "conv_kernel": [10, 8, 4],
    "conv_stride": [5, 4, 4],
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
    "feat_extract_norm": "layer",
    "classifier_proj_size": 16,
    "mask_time_prob": 0.0,
    "layerdrop": 0.0,
    "hidden_dropout": 0.0,
}


def run_script(*args: str) -> subprocess.CompletedProcess:
    return run_example(SCRIPT_DIR, "run_audio_classification.py", *args)


@pytest.mark.parametrize("model_type", ["wav2vec2", "hubert"])
def test_fsdd_from_scratch(tmp_path, shared_data, model_type):
    fsdd = shared_data / "audio" / "fsdd"
    out = tmp_path / model_type
    result = run_script(
        "--ipu_config_name=./",
        "--model_type",
        model_type,
        "--config_overrides",
        json.dumps(TINY),
        "--freeze_feature_encoder",
        "false",
        "--train_dir",
        str(fsdd / "train"),
        "--eval_dir",
        str(fsdd / "test"),
        "--label_column_name",
        "speaker",
        "--max_length_seconds",
        "1",
        "--do_train",
        "--do_eval",
        "--max_train_samples",
        "32",
        "--max_eval_samples",
        "24",
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "8",
        "--learning_rate",
        "5e-3",
        "--num_train_epochs",
        "12",
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
    assert everything["train_samples"] == 32 and everything["eval_samples"] == 24
    assert 0.0 <= everything["eval_accuracy"] <= 1.0
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 24  # 32 clips, 8 x 2 accumulated (./ipu_config.json): 2 steps an epoch
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 0.15, (first, last)  # which of 5 speakers: learnt from raw audio within 24 steps
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type
    assert sorted(config["label2id"]) == ["george", "jackson", "lucas", "nicolas", "yweweler"]
    extractor = json.loads((out / "preprocessor_config.json").read_text())
    assert extractor["sampling_rate"] == 16_000 and extractor["return_attention_mask"] is True


def test_pretrained_whisper_encoder_classifies_fsdd_digits(tmp_path, shared_data):
    """OpenAI's Whisper tiny.en (`../shared/models/whisper-tiny.en`) loaded as `WhisperForAudioClassification`: its
    pretrained encoder (frozen here; bf16 where the CPU has it natively), a new projector and classifier, in 2
    pipeline stages; one recording of each digit, learnt in 20 steps."""
    fsdd = shared_data / "audio" / "fsdd"
    clips = fsdd_subset(fsdd / "train", tmp_path / "clips", per_digit=1)
    out = tmp_path / "whisper"
    result = run_script(
        "--ipu_config_name=./",
        "--model_name_or_path",
        str(shared_data.parent / "models" / "whisper-tiny.en"),
        "--freeze_encoder",
        *half_precision_flags(),
        "--train_dir",
        str(clips),
        "--eval_dir",
        str(clips),
        "--max_length_seconds",
        "1",
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size",
        "1",
        "--per_device_eval_batch_size",
        "10",
        "--learning_rate",
        "1e-2",
        "--num_train_epochs",
        "4",
        *run_flags(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    assert everything["train_samples"] == 10 and everything["eval_samples"] == 10
    losses = [e["loss"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert len(losses) == 20  # 10 clips, 1 x 2 accumulated: 5 steps an epoch
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.3, (first, last)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["WhisperForAudioClassification"] and len(config["id2label"]) == 10


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location(
        "example_run_audio_classification", SCRIPT_DIR / "run_audio_classification.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_run_audio_classification"] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def test_bad_arguments_are_clear_errors(script, shared_data, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"give --dataset_name or --train_dir/--eval_dir"):
        script.DataTrainingArguments()
    with pytest.raises(ValueError, match=r"--max_length_seconds 0.0: expected a positive duration"):
        script.DataTrainingArguments(train_dir="x", max_length_seconds=0.0)
    with pytest.raises(ValueError, match="--config_overrides '.*': wav2vec2 configs have no hiden_size"):
        script.example_utils.new_config("wav2vec2", '{"hiden_size": 8}')
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "run_audio_classification.py",
            "--model_type",
            "wav2vec2",
            "--train_dir",
            str(shared_data / "audio" / "fsdd" / "train"),
            "--label_column_name",
            "digit",
            "--do_train",
            "--output_dir",
            str(tmp_path / "o"),
        ],
    )
    with pytest.raises(
        ValueError,
        match=r"--label_column_name digit: the train data has no such column \(columns: "
        r"label, transcription, speaker, audio\)",
    ):
        script.main()
