"""run_speech_recognition_seq2seq.py end to end on the shared Free Spoken Digit Dataset: OpenAI's pretrained Whisper
tiny.en (`../shared/models/whisper-tiny.en`) fine-tuned with IPUSeq2SeqTrainer in Optimum Graphcore's
`whisper-tiny-ipu` layout (encoder and decoder on 2 pipeline stages), evaluated by generating (WER by jiwer on
Whisper-normalized text) before and after training."""

from __future__ import annotations

import json
import subprocess

from ..conftest import REPO_ROOT
from ..helpers import fsdd_subset, half_precision_flags, run_example, run_flags

SCRIPT_DIR = REPO_ROOT / "examples" / "speech-recognition"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return run_example(SCRIPT_DIR, "run_speech_recognition_seq2seq.py", *args)


def test_pretrained_whisper_fine_tunes_on_fsdd_and_its_wer_falls(tmp_path, shared_data):
    """Every digit said twice to train on (the decoder only; bf16 where the CPU has it natively), once by another
    recording to evaluate: the word error rate scored before the first step (`--eval_on_start`) falls by the end of
    5 steps of 4 clips, one epoch (the encoder's forward over 30 s windows is most of the test's time: 0.6 -> 0.1 here;
    a second epoch, 0.0, doubled it)."""
    fsdd = shared_data / "audio" / "fsdd"
    train = fsdd_subset(fsdd / "train", tmp_path / "train", per_digit=2)
    test = fsdd_subset(fsdd / "test", tmp_path / "test", per_digit=1)
    out = tmp_path / "out"
    result = run_script(
        "--ipu_config_name",
        "Graphcore/whisper-tiny-ipu",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--model_name_or_path",
        str(shared_data.parent / "models" / "whisper-tiny.en"),
        "--train_dir",
        str(train),
        "--eval_dir",
        str(test),
        "--text_column_name",
        "transcription",
        "--do_train",
        "--do_eval",
        "--eval_on_start",
        "true",
        "--predict_with_generate",
        "--generation_max_length",
        "8",
        "--freeze_encoder",
        *half_precision_flags(),
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "10",
        "--learning_rate",
        "1e-4",
        "--num_train_epochs",
        "1",
        *run_flags(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"  # beside all_results.json
    assert everything["train_samples"] == 20 and everything["eval_samples"] == 10
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 5  # 20 clips, 4 a step: 5 steps an epoch
    before = [entry["eval_wer"] for entry in history if "eval_wer" in entry]  # --eval_on_start's
    assert len(before) == 1 and everything["eval_wer"] < before[0] - 0.2, (before, everything["eval_wer"])
    assert json.loads((out / "ipu_config.json").read_text())["layers_per_ipu"] == [4, 4]
    assert (out / "preprocessor_config.json").is_file() and (out / "tokenizer_config.json").is_file()
