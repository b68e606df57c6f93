"""Helper of `benchmarks/gpu_check.sh`: the up-front check, and the merged summary of its runs.

    python benchmarks/gpu_check_report.py preflight --work DIR [--ipu-config FILE]
    python benchmarks/gpu_check_report.py summarize --work DIR --out DIR --runs a,b,c [--tiny] [--chart]

`preflight` names every missing package in one line (exit 3), else prints the versions and what
`optimum-ipu env` sees (devices, and how the pipeline config's stages share them) and writes `DIR/preflight.json`.
`summarize` merges each run's `benchmark.json` with its exit status and time (from `DIR/runs.tsv`, one line per run
that ran: name, exit code, start, end, estimated seconds, note) into `OUT/summary.json`, packs each run's folder
(`benchmark.json`, `benchmark.png`, `run.log`) into `OUT/results.tar.gz`, and with `--chart` draws
`OUT/summary.png`, one panel per run. It is called after every run, so that a check stopped half-way still leaves
what ran. Only the standard library is needed (matplotlib for `--chart`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

# What `optimum-ipu benchmark` imports on its way (the package, `transformers.Trainer`, the chart). `datasets` is
# not among them: the GPU machine has none, and neither the benchmark nor the trainer needs it.
REQUIRED = [
    "torch",
    "transformers",
    "accelerate",
    "safetensors",
    "tokenizers",
    "huggingface_hub",
    "tqdm",
    "numpy",
    "matplotlib",
]
VERSIONED = ["torch", "transformers", "accelerate", "numpy", "matplotlib"]
RUN_FILES = ("benchmark.json", "benchmark.png", "run.log")
ERROR_TAIL_LINES = 15


def preflight(work: Path, ipu_config: str | None) -> int:
    """Check the imports up front: one line naming every missing package (exit 3), else the versions."""
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"gpu_check: missing Python package(s): {', '.join(missing)} (needed by optimum-ipu benchmark); "
            "install them, or carry them as wheels to the GPU machine"
        )
        return 3
    try:
        import optimum_ipu.benchmark  # noqa: F401  (the whole import chain of the benchmark, once)
    except ImportError as err:
        print(f"gpu_check: cannot import optimum_ipu.benchmark: {err} (install it, or run from the repository root)")
        return 3
    import torch

    import optimum_ipu
    from optimum_ipu.cli import main as cli_main

    cuda = torch.cuda.is_available()
    versions = {"optimum-ipu": optimum_ipu.__version__, "python": platform.python_version()}
    versions |= {name: importlib.metadata.version(name) for name in VERSIONED}
    versions |= {"torch": torch.__version__, "cuda": torch.version.cuda}  # the build, e.g. 2.11.0+cu130
    info = {
        "versions": versions,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "optimum_ipu_from": str(Path(optimum_ipu.__file__).parent),
    }
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f"; device: {info['device']}")
    (work / "preflight.json").write_text(json.dumps(info, indent=2))
    # devices, and how the pipeline config's stages share them (one process: in turn on one device)
    return cli_main(["env", *(["--ipu-config", ipu_config] if ipu_config else [])])


def _read_manifest(work: Path) -> dict[str, dict[str, Any]]:
    runs = {}
    path = work / "runs.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, code, start, end, estimate, note = line.split("\t")
        runs[name] = {
            "exit_code": int(code),
            "seconds": round(float(end) - float(start), 1),
            "h200_estimate_s": int(estimate),
            "note": note,
        }
    return runs


def _status(exit_code: int, note: str) -> str:
    if note.startswith("not applicable"):  # this machine cannot run it (tensor parallelism on one GPU): no failure
        return "not applicable"
    if note.startswith("skipped"):
        return "skipped"
    return {0: "ok", 124: "timed out", 137: "timed out"}.get(exit_code, "failed")


def _run_entry(name: str, record: dict[str, Any] | None, folder: Path) -> dict[str, Any]:
    """One run: its status, time, and its whole `benchmark.json` (or the tail of its log when it failed)."""
    if record is None:
        return {"status": "not run"}
    entry = {"status": _status(record["exit_code"], record["note"]), **record}
    report = folder / "benchmark.json"
    if entry["status"] == "ok" and report.exists():
        entry["benchmark"] = json.loads(report.read_text())
    elif entry["status"] == "ok":
        entry["status"] = "failed"  # exit 0 without its JSON: not a result
        entry["note"] = (entry["note"] + "; " if entry["note"] else "") + "no benchmark.json written"
    log = folder / "run.log"
    if entry["status"] != "ok" and log.exists():
        entry["error"] = log.read_text(errors="replace").splitlines()[-ERROR_TAIL_LINES:]
    return entry


def summarize(work: Path, out: Path, runs: list[str], tiny: bool, chart: bool) -> int:
    """Write `summary.json` and `results.tar.gz` (and `summary.png`) under `out`; exit 1 if a run did not succeed."""
    manifest = _read_manifest(work)
    pre = json.loads((work / "preflight.json").read_text()) if (work / "preflight.json").exists() else {}
    gpu = (work / "gpu.txt").read_text().strip() if (work / "gpu.txt").exists() else ""
    entries = {name: _run_entry(name, manifest.get(name), work / name) for name in runs}
    summary = {
        "check": "benchmarks/gpu_check.sh",
        "tiny": tiny,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": gpu or None,
        "device": pre.get("device"),
        "versions": pre.get("versions"),
        "optimum_ipu_from": pre.get("optimum_ipu_from"),
        "seconds": round(sum(e.get("seconds", 0.0) for e in entries.values()), 1),
        "h200_estimate_s": sum(e.get("h200_estimate_s", 0) for e in entries.values()),
        "ok": [name for name, e in entries.items() if e["status"] == "ok"],
        "not_ok": {name: e["status"] for name, e in entries.items() if e["status"] not in ("ok", "not applicable")},
        "runs": entries,
    }
    if not pre and (work / "preflight.log").exists():  # the packages missing, or the import that failed
        summary["preflight_error"] = (work / "preflight.log").read_text(errors="replace").splitlines()[-5:]
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    # Each run's folder, under its own name, in one archive: the device machine returns at most 8 files.
    with tarfile.open(out / "results.tar.gz", "w:gz") as archive:
        for name in runs:
            for file in RUN_FILES:
                if (work / name / file).exists():
                    archive.add(work / name / file, arcname=f"{name}/{file}")
        if (work / "preflight.json").exists():
            archive.add(work / "preflight.json", arcname="preflight.json")
    if chart:
        _chart(summary, out / "summary.png")
    return 0 if not summary["not_ok"] else 1


def _chart(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = summary["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.4 * len(runs)), squeeze=False)
    for ax, (name, entry) in zip(axes[:, 0], runs.items(), strict=True):
        report = entry.get("benchmark")
        if report is None or "results" not in report:  # failed, or not `optimum-ipu benchmark` (balance, bubbles)
            text = f"{name}: {entry['status']}" + (f"\n{report['headline']}" if report and "headline" in report else "")
            ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=8)
            ax.set_axis_off()
            continue
        bars = {r["name"]: r["samples_per_second"] for r in report["results"]} | report["anchors"]
        ax.barh(list(bars), list(bars.values()), color=["tab:blue"] + ["tab:gray"] * (len(bars) - 1))
        ax.invert_yaxis()
        for y, value in enumerate(bars.values()):
            ax.text(value, y, f" {value:,.1f}", va="center", fontsize=7)
        ratios = ", ".join(  # the end-to-end ratios (the latency modes' time-around-the-model ones are in the JSON)
            f"{k.removeprefix('ours / ')} {v:.2f}x" for k, v in report["ratios"].items() if "around the model" not in k
        )
        compiled = " compiled" if report["compile"] else ""
        micro = report.get("micro_batches_per_step") or 1  # ours' micro-batches per step (a pipeline config)
        split = f" (ours: {micro} x {report['batch_size'] // micro})" if micro > 1 else ""
        packing = report.get("packing")  # --packing: ours on packed rows, the baselines padded; bars are features/s
        if packing:
            split += f", ours packed {packing['packing_factor']:.2f} features a row vs padded, SQuAD features/s"
        ax.set_title(
            f"{name}: {report['model']} {report['mode']}{compiled}, seq {report['seq_len']} x batch "
            f"{report['batch_size']}{split}, {report['precision']}\nours vs {ratios}",
            fontsize=8,
        )
        ax.tick_params(labelsize=7)
    device = summary.get("device") or "?"
    axes[-1, 0].set_xlabel(f"samples (--packing: SQuAD features) / s on {device} ({summary['date']})", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("preflight", help="check the imports; print versions and devices")
    pre.add_argument("--work", type=Path, required=True)
    pre.add_argument("--ipu-config", help="the pipeline config, to show how its stages share the devices")
    summ = sub.add_parser("summarize", help="merge the runs into summary.json and results.tar.gz")
    summ.add_argument("--work", type=Path, required=True)
    summ.add_argument("--out", type=Path, required=True)
    summ.add_argument("--runs", required=True, help="every planned run, in order, comma-separated")
    summ.add_argument("--tiny", action="store_true")
    summ.add_argument("--chart", action="store_true", help="also draw summary.png")
    args = parser.parse_args(argv)
    if args.command == "preflight":
        return preflight(args.work, args.ipu_config)
    return summarize(args.work, args.out, args.runs.split(","), args.tiny, args.chart)


if __name__ == "__main__":
    sys.exit(main())
