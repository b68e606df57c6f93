"""`examples/speech-recognition/run_inference_ctc.py`, Optimum Graphcore's Wav2Vec2 inference script with its flags:
a tiny random Wav2Vec2ForCTC of 24 layers (the large model's count: `--use_large_model` lays it out on 2 stages)
transcribes 10 FSDD clips as `transformers` does on each clip alone, the WER and the benchmark's throughput are
printed, the large config's IPU-only `matmul_proportion` is named once, and a bad flag value is one line, exit 2."""

from __future__ import annotations

import ast
import csv
import importlib.util
import json
import sys

import datasets
import pytest
import torch
import transformers

from optimum_ipu.pipelines.audio import load_audio

from ..conftest import REPO_ROOT
from ..helpers import fsdd_subset, run_example

FOLDER = REPO_ROOT / "examples" / "speech-recognition"
RATE = 16_000


@pytest.fixture(scope="module")
def tiny_ctc_dir(tmp_path_factory):
    """A random Wav2Vec2ForCTC with 24 tiny layers and a letter vocabulary, saved with its Wav2Vec2Processor."""
    path = tmp_path_factory.mktemp("tiny-ctc")
    vocab = {"<pad>": 0, "<unk>": 1, "|": 2, **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz'")}}
    (path / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = transformers.Wav2Vec2CTCTokenizer(str(path / "vocab.json"), word_delimiter_token="|")
    extractor = transformers.Wav2Vec2FeatureExtractor(return_attention_mask=True, do_normalize=True)
    config = transformers.Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=24,
        num_attention_heads=2,
        intermediate_size=16,
        conv_dim=(16, 16),
        conv_kernel=(10, 8),
        conv_stride=(10, 8),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2,
        feat_extract_norm="layer",
        mask_time_prob=0.0,
        vocab_size=len(vocab),
        pad_token_id=0,
    )
    torch.manual_seed(0)
    transformers.Wav2Vec2ForCTC(config).save_pretrained(path)
    transformers.Wav2Vec2Processor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(path)
    return path


def _transformers_transcriptions(model_dir, files) -> list[str]:
    """`transformers`' own model on each clip alone: argmax, then the processor's batch_decode."""
    processor = transformers.Wav2Vec2Processor.from_pretrained(model_dir)
    model = transformers.Wav2Vec2ForCTC.from_pretrained(model_dir).eval()
    texts = []
    with torch.inference_mode():
        for path in files:
            inputs = processor(load_audio(str(path), RATE), sampling_rate=RATE, return_tensors="pt")
            texts += processor.batch_decode(model(**inputs).logits.argmax(dim=-1))
    return texts


def test_transcribes_scores_and_benchmarks_the_large_layout(tmp_path, shared_data, tiny_ctc_dir):
    clips = fsdd_subset(shared_data / "audio" / "fsdd" / "test", tmp_path / "fsdd", per_digit=1)
    flags = ["--model_name_or_path", str(tiny_ctc_dir), "--use_large_model", "--audio_folder", str(clips)]
    flags += ["--num_device_iterations", "4", "--max_samples", "8000", "--benchmark_iterations", "2"]
    run = run_example(FOLDER, "run_inference_ctc.py", *flags)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 3, lines  # the transcriptions (a list, as Optimum Graphcore printed them), WER, throughput
    transcriptions = ast.literal_eval(lines[0])
    files = [clips / row["file_name"] for row in csv.DictReader((clips / "metadata.csv").open())]
    assert len(transcriptions) == 10 and all(transcriptions)
    assert transcriptions == _transformers_transcriptions(tiny_ctc_dir, files)
    assert lines[1].startswith("WER: ") and lines[1].endswith("(10 recordings against the data's transcriptions)")
    assert float(lines[1].split()[1]) >= 0.0
    assert lines[2].startswith("Throughput: ") and "(2 iterations of a batch of 4 x 8000 samples, " in lines[2]
    assert float(lines[2].split()[1]) > 0.0
    assert run.stderr.count("matmul_proportion: IPU compiler memory knobs") == 1


def test_bad_flag_values_are_one_line_and_exit_2(tmp_path):
    bad = run_example(FOLDER, "run_inference_ctc.py", "--num_device_iterations", "0")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith("run_inference_ctc.py: error: --num_device_iterations 0: expected a positive number")
    )
    missing = run_example(FOLDER, "run_inference_ctc.py", "--audio_folder", str(tmp_path / "none"))
    assert missing.returncode == 2
    assert f"--audio_folder {tmp_path / 'none'}: no such folder" in missing.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("example_run_inference_ctc", FOLDER / "run_inference_ctc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_run_inference_ctc"] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def test_librispeech_rows_are_read_undecoded_with_their_text(script, shared_data, tmp_path, monkeypatch):
    """The Hub path (LibriSpeech's dummy set: an `Audio` column and `text`), on a local parquet copy of 3 FSDD clips:
    the first `--num_device_iterations` rows, their audio left for `soundfile` (no FFmpeg), their transcriptions."""
    fsdd = shared_data / "audio" / "fsdd" / "test"
    names = ["0_george_0.wav", "1_george_0.wav", "2_george_0.wav"]
    rows = {"audio": [str(fsdd / n) for n in names], "text": ["ZERO", "ONE", "TWO"]}
    local = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio(decode=False))
    local = local.cast_column("audio", datasets.Audio())  # typed as LibriSpeech's, but never decoded here
    (tmp_path / "dummy").mkdir()
    local.to_parquet(str(tmp_path / "dummy" / "validation.parquet"))
    monkeypatch.setattr(script, "LIBRISPEECH", (str(tmp_path / "dummy"), None, "validation"))
    audio, references = script.load_audio_data(script.InferenceArguments(num_device_iterations=2))
    assert references == ["ZERO", "ONE"]
    assert [len(load_audio(a, RATE)) for a in audio] == [len(load_audio(str(fsdd / n), RATE)) for n in names[:2]]
    assert script.word_error_rate([*references, None], ["Zero", "won", "x"]) == (0.5, 2)
