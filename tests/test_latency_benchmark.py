"""`optimum-ipu benchmark --mode latency | throughput` on a tiny model: every runner answers the same SQuAD requests
end to end, the report and chart are written, and the exact runners give eager PyTorch's answers. (Timings of a
loaded CI machine mean nothing: nothing here compares them.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers

from optimum_ipu.benchmark import format_report, run_benchmark
from optimum_ipu.benchmark.qa_runners import run_qa_spans
from optimum_ipu.benchmark.squad import SQUAD_ENV, exact_match_f1, load_requests, squad_answers
from optimum_ipu.benchmark.squad_accuracy import squad_accuracy
from optimum_ipu.pipelines.question_answering import answer_span_candidates

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _squad_file(shared_data, monkeypatch):
    monkeypatch.setenv(SQUAD_ENV, str(shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json"))


def test_latency_mode_times_every_runner_end_to_end(tmp_path):
    report = run_benchmark(
        model="tiny-bert-config", mode="latency", seq_len=128, steps=8, warmup=1, output_dir=str(tmp_path)
    )
    names = [r["name"] for r in report["results"]]
    assert names == [
        "optimum-ipu pipeline (onnxruntime)",
        "transformers eager (padded to 128)",
        "ONNX Runtime (fused graph, own length)",
    ]
    assert report["mode"] == "latency" and report["batch_size"] == 1 and report["requests"] == 8
    assert report["onnxruntime_runs_ours_session"]  # ours runs the exact fused graph: the same session, timed alike
    assert report["request_source"].startswith("SQuAD pairs") and 20 < report["mean_request_tokens"] <= 128
    for result in report["results"]:
        assert 0 < result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"]
        assert result["requests_per_second"] > 0
        assert result["answers_equal_to_eager"] >= 0.75  # exact backends; near-ties of random logits may flip
        # SQuAD EM/F1 against the file's gold answers (random weights: near 0, but computed for every runner)
        assert 0 <= result["squad"]["exact_match"] <= result["squad"]["f1"] <= 100
        # the model's share of every request, measured inside it: positive, and less than the whole request
        assert 0 < result["model_p50_ms"] < result["p50_ms"] and result["around_model_p50_ms"] > 0
    assert set(report["ratios"]) == {f"ours p50 / {name} p50" for name in names[1:]} | {
        f"ours around the model / {name} around the model" for name in names[1:]
    }
    assert json.loads((tmp_path / "benchmark.json").read_text()) == json.loads(json.dumps(report))
    assert (tmp_path / "benchmark.png").read_bytes()[:8] == PNG_MAGIC
    table = format_report(report)
    assert "p50 ms" in table and "transformers eager (padded to 128)" in table and "load average" in table


def test_throughput_mode_batches_requests(tmp_path):
    report = run_benchmark(
        model="tiny-bert-config",
        mode="throughput",
        seq_len=128,
        steps=2,
        warmup=1,
        batch_size=4,
        backends=("eager",),
        output_dir=str(tmp_path),
    )
    assert report["batch_size"] == 4 and report["requests"] == 8
    assert not report["onnxruntime_runs_ours_session"]  # ours runs eagerly: ONNX Runtime exports its own graph
    assert report["results"][0]["name"] == "optimum-ipu pipeline (eager)"
    assert all(r["requests_per_second"] > 0 for r in report["results"])
    with pytest.raises(ValueError, match="backends: \\['tensorrt'\\] unknown"):
        run_benchmark(model="tiny-bert-config", mode="latency", backends=("tensorrt",), output_dir=str(tmp_path))


def test_requests_come_from_squad_or_from_the_shipped_histogram(minilm_dir, monkeypatch, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    real, source = load_requests(5, tokenizer)
    assert len(real) == 5 and source.startswith("SQuAD pairs") and all(q.strip() and c for q, c in real)
    assert load_requests(5, tokenizer)[0] == real  # a fixed seed
    monkeypatch.setenv(SQUAD_ENV, str(tmp_path / "missing.json"))
    drawn, source = load_requests(50, tokenizer)
    assert "shipped histogram" in source and len(drawn) == 50
    assert squad_answers() == {} and exact_match_f1(["x"], drawn[:1], {}) is None  # no gold answers to score
    lengths = [len(tokenizer(q, c)["input_ids"]) for q, c in drawn]
    assert 100 < np.mean(lengths) < 260  # the histogram's mean is 176 tokens


def test_exact_match_and_f1_use_squads_normalisation(minilm_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    requests, _ = load_requests(2, tokenizer)
    gold = squad_answers()
    right = [gold[r][0].upper() + "." for r in requests]  # case and punctuation do not count
    assert exact_match_f1(right, requests, gold) == {"exact_match": 100.0, "f1": 100.0}
    half = exact_match_f1([right[0], "zzz"], requests, gold)
    assert half["exact_match"] == 50.0 and half["f1"] == 50.0


def test_squad_accuracy_scores_each_backend_on_whole_articles():
    scores = squad_accuracy(
        "tiny-bert-config", ("eager", "onnxruntime"), articles=(0, 1), seq_len=128, max_questions=32
    )
    assert set(scores) == {"eager", "onnxruntime"}
    assert scores["eager"] == scores["onnxruntime"]  # exact backends: the same answers, the same EM/F1
    assert all(0 <= s["exact_match"] <= s["f1"] <= 100 for s in scores.values())


def test_run_qa_spans_picks_the_best_span_as_the_pipeline(minilm_dir):
    """The baselines' span selection (run_qa's loops) and the pipeline's vectorized one choose the same answer."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    context = "The Eiffel tower is in Paris. It was built in 1889 for the World's Fair."
    encoded = tokenizer(
        ["When was it built?"],
        [context],
        truncation="only_second",
        max_length=64,
        stride=16,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_tensors="np",
    )
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=encoded["input_ids"].shape), rng.normal(size=encoded["input_ids"].shape)
    offsets = [
        o if s == 1 else None
        for o, s in zip(encoded["offset_mapping"][0].tolist(), encoded.sequence_ids(0), strict=True)
    ]
    nbest, _ = answer_span_candidates([start[0]], [end[0]], [offsets], max_answer_length=30)
    best = nbest[0]["offsets"]
    assert run_qa_spans(encoded, start, end, [context]) == [context[best[0] : best[1]]]
