"""What `optimum-ipu benchmark --mode train|inference` writes and prints: the report (`benchmark.json`), its chart
(`benchmark.png`) and its table; and what every mode's report shares (the device, the versions, how it is written).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch
import transformers

from .. import __version__
from .runners import RunResult

# Published anchors the chart shows beside the measured bars (samples/s), per (model, task, seq, mode).
ANCHORS = {("bert-base-uncased-config", "question-answering", 384, "train"): {"Graphcore IPU-POD16 (published)": 720.9}}


def device_name() -> str:
    """The GPU's name, or the CPU and its cores."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"


def versions(**extra: str) -> dict[str, str]:
    """The versions a report names: optimum-ipu, torch, transformers, any `extra`, then Python."""
    found = {"optimum-ipu": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
    return {**found, **extra, "python": platform.python_version()}


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (files only, no display); imported when a chart is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str) -> None:
    """Write a chart's figure to `path` (PNG, 120 dpi) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def write_report(report: dict, output_dir: str, draw: Callable[[dict, str], None]) -> None:
    """`benchmark.json` and `benchmark.png` (drawn by `draw`) in `output_dir`: the names every mode writes
    (`benchmarks/gpu_check.sh` collects them)."""
    os.makedirs(output_dir, exist_ok=True)
    stem = os.path.join(output_dir, "benchmark")
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    draw(report, stem + ".png")


def build_report(
    settings: dict[str, Any],
    sample_flops: float,
    ipu_config: str | None,
    micro_batches: int,
    results: Sequence[RunResult],
    packing: dict[str, Any] | None,
) -> dict[str, Any]:
    """The report of a `--mode train|inference` run: `settings` (mode, model, task, seq_len, batch_size, steps,
    warmup, precision, compile), the machine, each runner's results, and ours against each baseline."""
    ours = results[0].samples_per_second
    mode = settings["mode"]
    return {
        **settings,
        "flops_per_sample": sample_flops,
        "ipu_config": ipu_config,
        "micro_batches_per_step": micro_batches if mode == "train" else None,
        "device": device_name(),
        "versions": versions(),
        "date": time.strftime("%Y-%m-%d"),
        "results": [asdict(r) for r in results],
        "ratios": {f"ours / {r.name}": ours / r.samples_per_second for r in results[1:]},
        # the published anchor is samples/s of padded features: with --packing it compares with the baselines
        "anchors": ANCHORS.get((settings["model"], settings["task"], settings["seq_len"], mode), {}),
        "packing": packing,
    }


def chart(report: dict, path: str) -> None:
    """Bars of samples (or, with `--packing`, SQuAD features) per second, ours first, then the published anchors."""
    plt = pyplot()
    bars = {r["name"]: r["samples_per_second"] for r in report["results"]} | report["anchors"]
    fig, ax = plt.subplots(figsize=(8, 3 + 0.3 * len(bars)))
    ax.barh(list(bars), list(bars.values()), color=["tab:blue"] + ["tab:gray"] * (len(bars) - 1))
    ax.invert_yaxis()
    packing = report.get("packing")
    unit = "SQuAD features" if packing else "samples"
    ax.set_xlabel(f"{'training' if report['mode'] == 'train' else 'inference'} {unit} / s")
    layout = f", packed {packing['packing_factor']:.2f} features a row (baselines padded)" if packing else ""
    ax.set_title(
        f"{report['model']} {report['task']} ({report['mode']})\nseq {report['seq_len']}, "
        f"batch {report['batch_size']}{layout}, {report['precision']} on {report['device']}",
        fontsize=9,
    )
    for y, value in enumerate(bars.values()):
        ax.text(value, y, f" {value:,.2f}" if value < 10 else f" {value:,.1f}", va="center", fontsize=8)
    save_figure(fig, path)


def format_step_report(report: dict) -> str:
    """The report as a table: one line per runner (with `--packing`, the workload after them), then the ratios."""
    packing = report.get("packing")
    width = 32 if packing else 30
    samples, tokens = ("features/s", "real tok/s") if packing else ("samples/s", "tokens/s")
    lines = [
        f"{'runner':{width}s} {samples:>10s} {tokens:>10s} {'1st step s':>10s} {'TFLOP/s':>8s} "
        f"{'MFU':>6s} {'peak GiB':>8s}" + (f" {'steps':>5s}" if packing else "")
    ]
    for r in report["results"]:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        memory = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "n/a"
        steps = f" {r['packing']['steps']:5d}" if packing else ""
        lines.append(
            f"{r['name']:{width}s} {r['samples_per_second']:10.2f} {r['tokens_per_second']:10.0f} "
            f"{r['time_to_first_step_s']:10.2f} {r['tflops']:8.3f} {mfu:>6s} {memory:>8s}{steps}"
        )
    if packing:
        padding = packing["padding_fraction"]
        lines.append(
            f"packing: {packing['features']} SQuAD features ({packing['mean_feature_length']:.1f} tokens "
            f"on average) in {packing['rows']} rows of {report['seq_len']}: {packing['packing_factor']:.2f} "
            f"features a row; padding {padding['packed']:.1%} packed, {padding['padded']:.1%} "
            "padded"
        )
    lines += [f"{name}{' (features/s)' if packing else ''}: {ratio:.3f}" for name, ratio in report["ratios"].items()]
    lines += [f"anchor {name}: {value} samples/s" for name, value in report["anchors"].items()]
    return "\n".join(lines)


__all__ = [
    "ANCHORS",
    "build_report",
    "chart",
    "format_step_report",
    "write_report",
    "device_name",
    "versions",
    "pyplot",
    "save_figure",
]
