"""Draws the charts of BENCHMARKS.md from the JSON results they tabulate (benchmarks/results/*.json).

    python benchmarks/charts.py            # writes docs/benchmarks/scaling-cpu.png and packing-cpu.png

Needs matplotlib (`pip install 'optimum-ipu[benchmark]'`). Nothing is measured here: the figures are those of the
JSON files, written when the runs were made.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scaling_chart(results: dict, path: Path) -> Path:
    """Samples per second of each distributed layout, with its speed-up over one process."""
    plt = _pyplot()
    rows = results["rows"]
    base = rows[0]["samples_per_second"]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    names = [f"{r['layout']}\n({r['processes']} process{'es' if r['processes'] > 1 else ''})" for r in rows]
    values = [r["samples_per_second"] for r in rows]
    ax.barh(names, values, color=["tab:gray"] + ["tab:blue"] * (len(rows) - 1))
    ax.invert_yaxis()
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:.1f} ({value / base:.2f}x)", va="center", fontsize=8)
    ax.set_xlabel("training samples / s (global batch 64)")
    ax.set_xlim(0, max(values) * 1.25)
    ax.set_title(f"Distributed step time on CPU (gloo), {results['date']}\n{results['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def packing_chart(results: dict, path: Path) -> Path:
    """Features per second, packed vs padded, per model: grouped bars, normalised to transformers.Trainer."""
    plt = _pyplot()
    rows = results["rows"]
    runners = list(rows[0]["features_per_second"])
    fig, ax = plt.subplots(figsize=(8, 3.4))
    width = 0.8 / len(runners)
    colors = {runners[0]: "tab:blue"} | {name: c for name, c in zip(runners[1:], ("tab:gray", "silver"), strict=False)}
    for i, runner in enumerate(runners):
        xs = [j + (i - (len(runners) - 1) / 2) * width for j in range(len(rows))]
        ratios = [r["features_per_second"][runner] / r["features_per_second"][runners[1]] for r in rows]
        ax.bar(xs, ratios, width, label=runner, color=colors[runner])
        for x, ratio, row in zip(xs, ratios, rows, strict=True):
            ax.text(x, ratio, f"{row['features_per_second'][runner]:g}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), [r["model"] for r in rows])
    ax.set_ylabel(f"features/s vs {runners[1]}")
    ax.set_ylim(0, 2.4)
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f"Packing on CPU, SQuAD features at seq 384 (bar labels: features/s), {results['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


CHARTS = {
    "scaling-cpu-2026-12-01.json": ("scaling-cpu.png", scaling_chart),
    "packing-cpu-2026-12-01.json": ("packing-cpu.png", packing_chart),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON results")
    parser.add_argument("--output-dir", type=Path, default=DOCS, help="where the PNG files go")
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for source, (name, draw) in CHARTS.items():
        results = json.loads((args.results / source).read_text(encoding="utf-8"))
        print(f"wrote {draw(results, args.output_dir / name)}")


if __name__ == "__main__":
    main()
