"""run_speech_recognition_ctc.py end to end on the shared Free Spoken Digit Dataset: a tiny Wav2Vec2 and a tiny HuBERT
trained from a config, with the vocabulary built from the transcriptions and WER / CER by jiwer."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import transformers

from ..conftest import REPO_ROOT
from ..helpers import run_example

SCRIPT_DIR = REPO_ROOT / "examples" / "speech-recognition"
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "conv_dim": [16, 16, 16],
    "conv_kernel": [20, 8, 4],
    "conv_stride": [10, 4, 4],
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
}


def run_script(*args: str) -> subprocess.CompletedProcess:
    return run_example(SCRIPT_DIR, "run_speech_recognition_ctc.py", *args)


@pytest.mark.parametrize("model_type", ["wav2vec2", "hubert"])
def test_fsdd_ctc_from_scratch(tmp_path, shared_data, model_type):
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
        "--mask_time_prob",
        "0",
        "--train_dir",
        str(fsdd / "train"),
        "--eval_dir",
        str(fsdd / "test"),
        "--text_column_name",
        "transcription",
        "--max_duration_in_seconds",
        "1",
        "--do_train",
        "--do_eval",
        "--max_train_samples",
        "48",
        "--max_eval_samples",
        "16",
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "8",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "6",
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
    expected = {"train_loss", "train_samples_per_second", "eval_loss", "eval_wer", "eval_cer", "eval_samples"}
    assert expected <= set(everything), expected - set(everything)
    assert everything["train_samples"] == 48 and everything["eval_samples"] == 16
    assert everything["eval_wer"] >= 0.0 and everything["eval_cer"] >= 0.0
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 18  # 48 clips, 8 x 2 accumulated (./ipu_config.json): 3 steps an epoch
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.8 * first, (first, last)
    vocab = json.loads((out / "vocab.json").read_text())  # the letters of the ten digit names, | and the specials
    assert set(vocab) == set("zeroonetwothreefourfivesixseveneightnine") | {"|", "[UNK]", "[PAD]"}
    config = json.loads((out / "config.json").read_text())
    tokenizer = transformers.Wav2Vec2CTCTokenizer.from_pretrained(out)  # the vocabulary, plus its <s> and </s>
    assert config["vocab_size"] == len(tokenizer) and config["pad_token_id"] == vocab["[PAD]"]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location(
        "example_run_speech_recognition_ctc", SCRIPT_DIR / "run_speech_recognition_ctc.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_run_speech_recognition_ctc"] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def test_vocabulary_and_normalization(script):
    data = script.DataTrainingArguments(train_dir="x", chars_to_ignore=[",", "?", "."])
    normalize = script.normalizer(data.chars_to_ignore)
    assert normalize("Ask not, what?") == "ask not what"
    vocab = script.build_vocabulary(["ask not", "what"], data)
    assert list(vocab) == ["|", "a", "h", "k", "n", "o", "s", "t", "w", "[UNK]", "[PAD]"]


def test_the_frames_of_a_clips_padding_are_not_decoded(script, tmp_path):
    """Clips are padded to the longest; the letters predicted over the padding were read as the clip's, so a model
    right on every clip scored WER 1.0. Each clip's own frames only are decoded."""
    data = script.DataTrainingArguments(train_dir="x")
    (tmp_path / "vocab.json").write_text(json.dumps(script.build_vocabulary(["one", "two"], data)))
    tokenizer = script.Wav2Vec2CTCTokenizer(str(tmp_path / "vocab.json"), unk_token="[UNK]", pad_token="[PAD]")
    pad, ids = tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids
    said = [ids(list("one")) + [pad] + ids(list("of")), ids(list("two")) + [pad] * 3]  # 4 frames of "one", then padding
    labels = np.array([ids(list("one")) + [-100], ids(list("two")) + [-100]])
    prediction = script.EvalPrediction(predictions=np.array(said), label_ids=labels)
    assert script.error_rates(tokenizer, ["wer"])(prediction)["wer"] == 0.5  # "oneof" read as the clip's
    assert script.error_rates(tokenizer, ["wer"], frames=[4, 6])(prediction)["wer"] == 0.0


def test_bad_arguments_are_clear_errors(script, shared_data, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--eval_metrics bleu: unknown; choose from wer, cer"):
        script.DataTrainingArguments(train_dir="x", eval_metrics=["bleu"])
    with pytest.raises(ValueError, match="give --model_name_or_path, or --model_type"):
        script.ModelArguments()
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "run_speech_recognition_ctc.py",
            "--model_type",
            "wav2vec2",
            "--train_dir",
            str(shared_data / "audio" / "fsdd" / "train"),
            "--do_train",
            "--output_dir",
            str(tmp_path / "o"),
        ],
    )
    with pytest.raises(
        ValueError,
        match=r"--text_column_name text: the train data has no such column \(columns: "
        r"label, transcription, speaker, audio\)",
    ):
        script.main()
