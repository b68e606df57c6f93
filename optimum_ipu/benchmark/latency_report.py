"""What `optimum-ipu benchmark --mode latency | throughput` writes and prints: the report (`benchmark.json`), its
chart (`benchmark.png`) and its table."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np
import torch

from ..runtime.inference.runner import onnxruntime_available
from .report import device_name, pyplot, save_figure, versions
from .squad import Request, exact_match_f1, squad_answers


def percentiles(times: list[float]) -> dict[str, float]:
    """p50, p90, p99 and the mean of `times` (seconds), in milliseconds."""
    ms = np.asarray(times) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
    }


def runner_results(
    measured: dict[str, dict], rows: int, eager: str, pairs: list[Request], gold: dict[Request, list[str]]
) -> list[dict[str, Any]]:
    """Each runner's latency percentiles, requests per second, the p50 split into the model's forward and the rest,
    its answers' agreement with the eager runner `eager`, and their SQuAD EM/F1 against `gold`."""
    results = []
    for name, m in measured.items():
        stats = percentiles(m["times"])
        stats["requests_per_second"] = rows * len(m["times"]) / sum(m["times"])
        # the model's share and the rest (tokenization, batching, span selection), request by request
        stats["model_p50_ms"] = float(np.percentile(np.asarray(m["model_times"]) * 1e3, 50))
        around = np.asarray(m["times"]) - np.asarray(m["model_times"])
        stats["around_model_p50_ms"] = float(np.percentile(around * 1e3, 50))
        same = sum(a == b for a, b in zip(m["answers"], measured[eager]["answers"], strict=True))
        equal = same / max(1, len(m["answers"]))
        results.append(
            {"name": name, **stats, "samples_per_second": stats["requests_per_second"], "answers_equal_to_eager": equal}
        )
        results[-1]["squad"] = exact_match_f1(m["answers"], pairs, gold)  # the accuracy cost of a runner (int8)
    return results


def latency_report(
    measured: dict, model: str, mode: str, seq_len: int, rows: int, source: str, eager: str, tokenizer: Any, timed: list
) -> dict[str, Any]:
    """The report of a latency / throughput run: what ran, on what, each runner's results (`runner_results`) and
    ours against each other runner, end to end and around the model."""
    pairs = [request for batch in timed for request in batch]
    gold = squad_answers() if source.startswith("SQuAD") else {}
    results = runner_results(measured, rows, eager, pairs, gold)
    ours = results[0]
    lengths = [len(tokenizer(q, c, truncation="only_second", max_length=seq_len)["input_ids"]) for q, c in pairs]
    return {
        "mode": mode,
        "model": model,
        "seq_len": seq_len,
        "batch_size": rows,
        "requests": sum(len(b) for b in timed),
        "request_source": source,
        "mean_request_tokens": statistics.mean(lengths),
        "threads": torch.get_num_threads(),
        "device": device_name(),
        # the fields every benchmark report has (gpu_check's summary reads them)
        "precision": "pipeline default (fp16 on GPUs, fp32 on CPUs); baselines fp32",
        "compile": any("compile" in r["name"] for r in results),
        "anchors": {},
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "versions": latency_versions(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "results": results,
        "ratios": {
            **{f"ours p50 / {r['name']} p50": ours["p50_ms"] / r["p50_ms"] for r in results[1:]},
            **{
                f"ours around the model / {r['name']} around the model": ours["around_model_p50_ms"]
                / r["around_model_p50_ms"]
                for r in results[1:]
            },
        },
    }


def latency_versions() -> dict[str, str]:
    """The report's versions, ONNX Runtime's among them where it is installed."""
    if onnxruntime_available():
        import onnxruntime

        return versions(onnxruntime=onnxruntime.__version__)
    return versions()


def latency_chart(report: dict, path: str) -> None:
    """Bars of p50 latency with p90 / p99 marks (latency), or of requests per second (throughput)."""
    plt = pyplot()
    results = report["results"]
    fig, ax = plt.subplots(figsize=(8, 2 + 0.5 * len(results)))
    names = [r["name"] for r in results]
    colors = ["tab:blue"] + ["tab:gray"] * (len(results) - 1)
    if report["mode"] == "latency":
        values = [r["p50_ms"] for r in results]
        ax.barh(names, values, color=colors)
        # the end of each bar: the p50 time around the model (tokenization, batching, span selection)
        around = [r.get("around_model_p50_ms", 0.0) for r in results]
        lefts = [v - a for v, a in zip(values, around, strict=True)]
        ax.barh(names, around, left=lefts, color="none", edgecolor="black", hatch="////", label="around the model")
        ax.scatter([r["p90_ms"] for r in results], names, marker="|", s=200, color="black", label="p90")
        ax.scatter([r["p99_ms"] for r in results], names, marker="x", color="tab:red", label="p99")
        ax.set_xlabel("milliseconds per request, end to end (bar: p50)")
        ax.legend(loc="lower right", fontsize=8)
    else:
        values = [r["requests_per_second"] for r in results]
        ax.barh(names, values, color=colors)
        ax.set_xlabel("requests / s, end to end")
    ax.invert_yaxis()
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:.1f}", va="center", fontsize=8)
    ax.set_title(
        f"{report['model']} question answering, {report['mode']} (batch {report['batch_size']}), "
        f"seq {report['seq_len']}"
        f"\n{report['requests']} SQuAD requests, {report['mean_request_tokens']:.0f} tokens on average, "
        f"{report['device']}, {report['threads']} threads",
        fontsize=9,
    )
    save_figure(fig, path)


def format_latency_report(report: dict) -> str:
    """The report as a table: one line per runner, then the ratios."""
    lines = [
        f"{'runner':44s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'model':>8s} {'around':>8s} {'req/s':>8s} "
        f"{'= eager':>8s} {'EM / F1':>12s}"
    ]
    for r in report["results"]:
        squad = r.get("squad")
        accuracy = f"{squad['exact_match']:5.1f} / {squad['f1']:4.1f}" if squad else "n/a"
        lines.append(
            f"{r['name']:44s} {r['p50_ms']:8.2f} {r['p90_ms']:8.2f} {r['p99_ms']:8.2f} {r['model_p50_ms']:8.2f} "
            f"{r['around_model_p50_ms']:8.3f} {r['requests_per_second']:8.1f} {r['answers_equal_to_eager']:8.1%} "
            f"{accuracy:>12s}"
        )
    lines.append(
        f"{report['requests']} requests ({report['request_source']}), {report['mean_request_tokens']:.1f} tokens on "
        f"average; load average {report['load_average']}; model / around: p50 ms in the model's forward / in the "
        "rest (tokenization, batching, span selection)"
    )
    lines += [f"{name}: {ratio:.3f}" for name, ratio in report["ratios"].items()]
    return "\n".join(lines)


__all__ = ["latency_report", "latency_chart", "format_latency_report", "percentiles"]
