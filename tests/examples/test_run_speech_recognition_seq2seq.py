"""run_speech_recognition_seq2seq.py end to end on the shared Free Spoken Digit Dataset: a tiny Whisper fine-tuned with
IPUSeq2SeqTrainer on 2 pipeline stages (encoder, decoder), evaluated by generating at static shapes (WER by jiwer)."""

from __future__ import annotations

import json
import subprocess

from ..conftest import REPO_ROOT
from ..helpers import run_example
from ..tiny_models_vision_speech import save_tiny_whisper

SCRIPT_DIR = REPO_ROOT / "examples" / "speech-recognition"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return run_example(SCRIPT_DIR, "run_speech_recognition_seq2seq.py", *args)


def test_fsdd_whisper_with_generation(tmp_path, shared_data):
    fsdd = shared_data / "audio" / "fsdd"
    model = save_tiny_whisper(tmp_path / "tiny-whisper")
    out = tmp_path / "out"
    result = run_script(
        "--ipu_config_name",
        "Graphcore/whisper-tiny-ipu",
        "--ipu_config_overrides",
        "layers_per_ipu=[2 2],inference_layers_per_ipu=[2 2],gradient_accumulation_steps=2",
        "--model_name_or_path",
        model,
        "--train_dir",
        str(fsdd / "train"),
        "--eval_dir",
        str(fsdd / "test"),
        "--text_column_name",
        "transcription",
        "--do_train",
        "--do_eval",
        "--predict_with_generate",
        "--generation_max_length",
        "8",
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "4",
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
    expected = {"train_loss", "train_samples_per_second", "eval_loss", "eval_wer", "eval_samples"}
    assert expected <= set(everything), expected - set(everything)
    assert everything["train_samples"] == 16 and everything["eval_samples"] == 8 and everything["eval_wer"] >= 0.0
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 8  # 16 clips, 4 x 2 accumulated: 2 steps an epoch
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert last < first - 0.4, (first, last)
    assert json.loads((out / "ipu_config.json").read_text())["layers_per_ipu"] == [2, 2]
    assert (out / "preprocessor_config.json").is_file() and (out / "tokenizer_config.json").is_file()
