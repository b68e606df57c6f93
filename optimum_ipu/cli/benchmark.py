"""`optimum-ipu benchmark`: ours against plain `transformers` and a plain PyTorch loop, in one run, on the same
batches, with random weights of a named architecture (nothing is downloaded).

`--mode train` (the default) times training steps: `IPUTrainer` vs `transformers.Trainer` vs a plain loop.
`--mode inference` times forward passes: the pipelined model in its inference layout through the engine (its
precision / autocast, `torch.compile` with `--compile`), as evaluation and `pipeline()` run it, vs
`transformers.Trainer.predict` vs a plain `torch.no_grad()` loop.

Throughput is measured over the steady steps only: the first `--warmup` steps (compilation included) are timed
apart and reported as time to first step. FLOPs per sample are counted by `torch.utils.flop_counter` over one
forward (and in training its backward) of the model at the sample's length; they match the usual counts for
transformers (`6 x P x s + 12 x L x h x s^2` in training, a third of it in inference; P the non-embedding
parameters, L layers, h hidden size, s tokens) to 0.1%.

`--packing` (training, question answering) trains every runner on the same real-length SQuAD features: ours on
rows packed several features to a row, the baselines on the features padded to `--seq-len`; throughput is then
SQuAD features per second (`benchmark_packing` builds the work).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import time
from dataclasses import asdict
from functools import partial
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm

from .. import __version__
from ..config import IPUConfig
from ..packing import check_packing_support
from .benchmark_latency import LATENCY_MODES, format_latency_report, run_latency_benchmark
from .benchmark_packing import (
    FEATURE_LENGTHS_FILE,
    build_workload,
    check_packing_arguments,
    feature_flops,
    load_feature_lengths,
)
from .benchmark_runners import (
    ARCHITECTURES,
    TASKS,
    RunResult,
    build_runners,
    flops_per_sample,
    make_model,
    micro_batches_per_step,
    packing_result,
    packing_runners,
    synthetic_batches,
)

logger = logging.getLogger(__name__)

MODES = ("train", "inference", *LATENCY_MODES)
# Published anchors the chart shows beside the measured bars (samples/s), per (model, task, seq, mode).
ANCHORS = {("bert-base-uncased-config", "question-answering", 384, "train"): {"Graphcore IPU-POD16 (published)": 720.9}}


def run_benchmark(
    model: str = "bert-base-uncased-config",
    task: str = "question-answering",
    seq_len: int = 384,
    batch_size: int = 64,
    steps: int = 20,
    warmup: int = 3,
    precision: str = "auto",
    compile: bool = False,
    ipu_config: str | None = None,
    peak_tflops: float | None = None,
    output_dir: str = "benchmark_results",
    mode: str = "train",
    packing: bool = False,
    backends: tuple[str, ...] = ("auto",),
) -> dict[str, Any]:
    """Run every runner of `mode` (`"train"` or `"inference"`) on the same batches and write `benchmark.json` and
    `benchmark.png` to `output_dir`; returns the report (what the JSON holds). `batch_size` is the samples of one
    optimizer step (training) or one host call (inference) in every runner: ours splits a training step into the
    IPU config's `gradient_accumulation_steps x replication_factor` micro-batches, so that the figures compare.

    `mode="latency"` / `"throughput"` answers SQuAD questions end to end instead (`benchmark_latency`: `steps`
    timed requests, or batches of `batch_size` requests, after `warmup`; our `backends`), writing `latency.json` /
    `throughput.json` and their charts.

    With `packing` (training, question answering): every runner trains on the same real-length SQuAD features
    (`benchmark_packing.build_workload`): ours `steps` steps of `batch_size` packed rows, the baselines the same
    features padded, `batch_size` a step. Samples are then features: `samples_per_second` is features per second
    over the steps after `warmup` (features in them / their time), `tokens_per_second` real tokens per second,
    `flops_per_sample` the mean model FLOPs of a feature at its own length; `packing` holds the workload."""
    if mode in LATENCY_MODES:  # answering SQuAD requests end to end: its own runners (benchmark_latency)
        return run_latency_benchmark(
            model=model,
            mode=mode,
            seq_len=seq_len,
            requests=steps,
            warmup=warmup,
            batch_size=batch_size,
            backends=backends,
            ipu_config=ipu_config,
            output_dir=output_dir,
        )
    if packing:
        check_packing_arguments(mode, task)
    if mode not in MODES:
        raise ValueError(f"--mode {mode!r}: expected one of {', '.join(MODES)}")
    if model not in ARCHITECTURES:
        raise ValueError(f"--model {model!r}: expected one of {', '.join(ARCHITECTURES)}")
    if task not in TASKS:
        raise ValueError(f"--task {task!r}: expected one of {', '.join(TASKS)}")
    if steps <= warmup:
        raise ValueError(f"--steps {steps} must exceed --warmup {warmup}: the timed window would be empty")
    # checked here too (not only by the command line): run_benchmark is called from Python as well
    for flag, value, low in (("--seq-len", seq_len, 1), ("--batch-size", batch_size, 1), ("--warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{flag} {value!r}: expected an integer >= {low}")
    if peak_tflops is not None and not peak_tflops > 0:
        raise ValueError(f"--peak-tflops {peak_tflops!r}: expected the device's peak, a positive number")
    cuda = torch.cuda.is_available()
    if precision == "auto":
        precision = "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    opts = {"batch_size": batch_size, "precision": precision, "compile": compile}
    config = IPUConfig.from_pretrained(ipu_config) if ipu_config else IPUConfig()
    iterations = config.value("device_iterations", inference=True)
    if mode == "inference" and batch_size % iterations:
        raise ValueError(
            f"--batch-size {batch_size}: one inference host call runs inference_device_iterations={iterations} "
            f"equal batches; use a multiple of {iterations}"
        )
    micro_batches = micro_batches_per_step(config)
    if mode == "train" and batch_size % micro_batches:
        raise ValueError(
            f"--batch-size {batch_size}: it is the samples of one optimizer step, and one step of the IPU config "
            f"takes gradient_accumulation_steps x replication_factor = {micro_batches} micro-batches; use a "
            f"multiple of {micro_batches}"
        )
    reference = make_model(model, task)
    workload, packing_info = None, None
    if packing:
        check_packing_support(reference)  # before any work: a family that cannot take packed rows is refused
        lengths = load_feature_lengths()
        workload = build_workload(
            lengths["histogram"],
            seq_len,
            batch_size,
            steps,
            reference.config.vocab_size,
            max_length=lengths["max_length"],
        )
        runners = packing_runners(model, workload, opts, config)
        # model FLOPs of each feature at its own length: what both layouts do usefully
        sample_flops = feature_flops(
            workload.lengths, partial(flops_per_sample, reference, reference.config, training=True)
        )
        provenance = {
            key: lengths[key]
            for key in ("source_file", "source_sha256", "tokenizer", "max_length", "stride", "features")
        }
        packing_info = {
            "feature_lengths": {"file": f"optimum_ipu/data/{FEATURE_LENGTHS_FILE.name}", **provenance},
            "length_scale": min(1.0, seq_len / lengths["max_length"]),
            "seed": 0,
            **workload.summary(),
        }
        total_steps = steps + 2 * workload.padded_steps
    else:
        batches = synthetic_batches(task, ARCHITECTURES[model](), batch_size, seq_len, steps, mode=mode)
        runners = build_runners(mode, model, task, batches, opts, config)
        sample_flops = flops_per_sample(reference, reference.config, seq_len, training=mode == "train")
        total_steps = steps * len(runners)
    del reference
    results = []
    with tqdm(total=total_steps, desc=f"benchmark ({mode}{', packing' if packing else ''})", unit="step") as bar:
        for name, runner in runners.items():
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            if packing:
                times, features = runner(bar)
                measured = packing_result(name, times, features, warmup, workload, sample_flops)
            else:
                times = runner(bar)
                samples = batch_size / statistics.median(times[warmup:])
                measured = {
                    "samples_per_second": samples,
                    "tokens_per_second": samples * seq_len,
                    "tflops": samples * sample_flops / 1e12,
                }
            results.append(
                RunResult(
                    name=name,
                    time_to_first_step_s=times[0],
                    step_times_s=times,
                    peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                    mfu=measured["tflops"] / peak_tflops if peak_tflops else None,
                    **measured,
                )
            )
    ours = results[0].samples_per_second
    report = {
        "mode": mode,
        "model": model,
        "task": task,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "steps": steps,
        "warmup": warmup,
        "precision": precision,
        "compile": compile,
        "flops_per_sample": sample_flops,
        "ipu_config": ipu_config,
        "micro_batches_per_step": micro_batches if mode == "train" else None,
        "device": torch.cuda.get_device_name(0) if cuda else f"CPU ({os.cpu_count()} cores)",
        "versions": {
            "optimum-ipu": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d"),
        "results": [asdict(r) for r in results],
        "ratios": {f"ours / {r.name}": ours / r.samples_per_second for r in results[1:]},
        # the published anchor is samples/s of padded features: with --packing it compares with the baselines
        "anchors": ANCHORS.get((model, task, seq_len, mode), {}),
        "packing": packing_info,
    }
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "benchmark.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    _chart(report, os.path.join(output_dir, "benchmark.png"))
    return report


def _chart(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_report(report: dict) -> str:
    if report["mode"] in LATENCY_MODES:
        return format_latency_report(report)
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


__all__ = ["run_benchmark", "format_report", "flops_per_sample", "ARCHITECTURES", "TASKS", "MODES"]
