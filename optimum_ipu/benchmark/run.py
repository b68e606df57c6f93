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
SQuAD features per second (`packing` builds the work).

`--mode latency` / `--mode throughput` answer SQuAD questions end to end instead (`latency`); `--mode latency
--task automatic-speech-recognition` transcribes recordings with ours and `transformers`' pipelines
(`speech_latency`). `--mode serve` times HTTP servers and has its own entry point (`serve.run_serve_benchmark`);
`format_report` prints its report too.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
from tqdm.auto import tqdm

from ..config import IPUConfig
from ..packing import check_packing_support
from .architectures import ARCHITECTURES, TASKS, flops_per_sample, make_model, synthetic_batches
from .arguments import check_integers
from .latency import LATENCY_MODES, run_latency_benchmark
from .latency_report import format_latency_report
from .packing import (
    FEATURE_LENGTHS_FILE,
    PackingWorkload,
    build_workload,
    check_packing_arguments,
    feature_flops,
    load_feature_lengths,
)
from .recipe import format_recipe_report, run_recipe_benchmark
from .report import build_report, chart, format_step_report, write_report
from .runners import RunResult, build_runners, micro_batches_per_step, packing_result, packing_runners
from .serve_report import format_serve_report
from .speech_latency import SPEECH_TASK, format_speech_report, run_speech_latency_benchmark

MODES = ("train", "inference", *LATENCY_MODES, "recipe")
DEFAULT_ARCHITECTURE = "bert-base-uncased-config"


@dataclass
class StepSettings:
    """What a `--mode train|inference` run measures: the first fields of its report, in their order."""

    mode: str
    model: str
    task: str
    seq_len: int
    batch_size: int
    steps: int
    warmup: int
    precision: str
    compile: bool

    @property
    def runner_options(self) -> dict[str, Any]:
        """What every runner takes: the samples of a step, the precision and whether to `torch.compile`."""
        return {"batch_size": self.batch_size, "precision": self.precision, "compile": self.compile}


@dataclass
class Work:
    """What the runners of one run run: runner name -> its timed run (ours first), the model FLOPs of a sample,
    the steps of all runners (the progress bar's total); with `--packing`, the workload and its report entry."""

    runners: dict[str, Callable[[tqdm], Any]]
    sample_flops: float
    total_steps: int
    workload: PackingWorkload | None = None
    packing: dict[str, Any] | None = None


def run_benchmark(
    model: str = DEFAULT_ARCHITECTURE,
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
    pairs: int = 3,
) -> dict[str, Any]:
    """Run every runner of `mode` (`"train"` or `"inference"`) on the same batches and write `benchmark.json` and
    `benchmark.png` to `output_dir`; returns the report (what the JSON holds). `batch_size` is the samples of one
    optimizer step (training) or one host call (inference) in every runner: ours splits a training step into the
    IPU config's `gradient_accumulation_steps x replication_factor` micro-batches, so that the figures compare.

    `mode="latency"` / `"throughput"` answers SQuAD questions end to end instead (`latency.run_latency_benchmark`:
    `steps` timed requests, or batches of `batch_size` requests, after `warmup`; our `backends`), writing the same
    two files; with `task="automatic-speech-recognition"` and a model folder, `mode="latency"` transcribes
    `jfk.flac` and `steps` FSDD clips with ours and `transformers`' pipelines
    (`speech_latency.run_speech_latency_benchmark`).

    With `packing` (training, question answering): every runner trains on the same real-length SQuAD features
    (`packing.build_workload`): ours `steps` steps of `batch_size` packed rows, the baselines the same features
    padded, `batch_size` a step. Samples are then features: `samples_per_second` is features per second over the
    steps after `warmup` (features in them / their time), `tokens_per_second` real tokens per second,
    `flops_per_sample` the mean model FLOPs of a feature at its own length; `packing` holds the workload.

    `mode="recipe"`: `IPUTrainer` against `transformers.Trainer` on the demo's question-answering recipe (real SQuAD
    features, a pretrained `model` folder, by default the PyPI MiniLM; `steps` optimizer steps of `batch_size`
    features), each in its own process, `pairs` times (`recipe.run_recipe_benchmark`)."""
    if mode in LATENCY_MODES and task == SPEECH_TASK:  # transcribing recordings (speech_latency.py); steps: clips
        if mode != "latency":
            raise ValueError(f"--task {SPEECH_TASK} is timed in --mode latency (batch 1), not {mode!r}")
        return run_speech_latency_benchmark(model, steps, warmup, ipu_config, output_dir)
    if mode == "recipe":  # the demo's training recipe: ours vs Trainer, each run in its own process
        chosen = None if model == DEFAULT_ARCHITECTURE else model
        return run_recipe_benchmark(chosen, seq_len, batch_size, steps, warmup, pairs, output_dir)
    if mode in LATENCY_MODES:  # answering SQuAD requests end to end: its own runners (latency.py); steps: requests
        return run_latency_benchmark(model, mode, seq_len, steps, warmup, batch_size, backends, ipu_config, output_dir)
    if packing:
        check_packing_arguments(mode, task)
    settings = StepSettings(mode, model, task, seq_len, batch_size, steps, warmup, precision, compile)
    check_step_arguments(settings, peak_tflops)
    settings.precision = resolve_precision(precision)
    config = IPUConfig.from_pretrained(ipu_config) if ipu_config else IPUConfig()
    micro_batches = check_batch_size(config, mode, batch_size)
    work = packed_work(settings, config) if packing else synthetic_work(settings, config)
    results = measure(work, settings, peak_tflops)
    report = build_report(asdict(settings), work.sample_flops, ipu_config, micro_batches, results, work.packing)
    write_report(report, output_dir, chart)
    return report


def check_step_arguments(settings: StepSettings, peak_tflops: float | None) -> None:
    """Refuse, naming the flag, what `--mode train|inference` cannot run; checked here too (not only by the
    command line): `run_benchmark` is called from Python as well."""
    choices = (
        ("--mode", settings.mode, MODES),
        ("--model", settings.model, ARCHITECTURES),
        ("--task", settings.task, TASKS),
    )
    for flag, value, allowed in choices:
        if value not in allowed:
            raise ValueError(f"{flag} {value!r}: expected one of {', '.join(allowed)}")
    if settings.steps <= settings.warmup:
        raise ValueError(
            f"--steps {settings.steps} must exceed --warmup {settings.warmup}: the timed window would be empty"
        )
    check_integers(
        (("--seq-len", settings.seq_len, 1), ("--batch-size", settings.batch_size, 1), ("--warmup", settings.warmup, 0))
    )
    if peak_tflops is not None and not peak_tflops > 0:
        raise ValueError(f"--peak-tflops {peak_tflops!r}: expected the device's peak, a positive number")


def resolve_precision(precision: str) -> str:
    """`"auto"`: bf16 on a GPU that has it, else fp32; any other value as it is."""
    if precision == "auto":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    return precision


def check_batch_size(config: IPUConfig, mode: str, batch_size: int) -> int:
    """Refuse a batch that our runner cannot split as the IPU config says; returns the micro-batches of a step."""
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
    return micro_batches


def synthetic_work(settings: StepSettings, config: IPUConfig) -> Work:
    """Every runner on the same random batches of `seq_len` tokens, `steps` of them each."""
    reference = make_model(settings.model, settings.task)
    shape = (settings.batch_size, settings.seq_len, settings.steps)
    batches = synthetic_batches(settings.task, reference.config, *shape, mode=settings.mode)
    runners = build_runners(settings.mode, settings.model, settings.task, batches, settings.runner_options, config)
    training = settings.mode == "train"
    sample_flops = flops_per_sample(reference, reference.config, settings.seq_len, training=training)
    return Work(runners, sample_flops, settings.steps * len(runners))


def packed_work(settings: StepSettings, config: IPUConfig) -> Work:
    """`--packing`: the same real-length SQuAD features for every runner, packed for ours and padded for the
    baselines; FLOPs of a sample are the mean model FLOPs of a feature at its own length (what both layouts do
    usefully)."""
    reference = make_model(settings.model, settings.task)
    check_packing_support(reference)  # before any work: a family that cannot take packed rows is refused
    lengths = load_feature_lengths()
    workload = build_workload(
        lengths["histogram"],
        settings.seq_len,
        settings.batch_size,
        settings.steps,
        reference.config.vocab_size,
        max_length=lengths["max_length"],
    )
    runners = packing_runners(settings.model, workload, settings.runner_options, config)
    count = partial(flops_per_sample, reference, reference.config, training=True)
    provenance = {
        key: lengths[key] for key in ("source_file", "source_sha256", "tokenizer", "max_length", "stride", "features")
    }
    packing = {
        "feature_lengths": {"file": f"optimum_ipu/data/{FEATURE_LENGTHS_FILE.name}", **provenance},
        "length_scale": min(1.0, settings.seq_len / lengths["max_length"]),
        "seed": 0,
        **workload.summary(),
    }
    total_steps = settings.steps + 2 * workload.padded_steps
    return Work(runners, feature_flops(workload.lengths, count), total_steps, workload, packing)


def measure(work: Work, settings: StepSettings, peak_tflops: float | None) -> list[RunResult]:
    """Run each runner in turn under one progress bar; its rates over the steps after `warmup`, its first step's
    time and (on a GPU) its peak memory."""
    cuda = torch.cuda.is_available()
    desc = f"benchmark ({settings.mode}{', packing' if work.workload else ''})"
    results = []
    with tqdm(total=work.total_steps, desc=desc, unit="step") as bar:
        for name, runner in work.runners.items():
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            if work.workload is not None:
                times, features = runner(bar)
                measured = packing_result(name, times, features, settings.warmup, work.workload, work.sample_flops)
            else:
                times = runner(bar)
                measured = step_rates(times, settings, work.sample_flops)
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
    return results


def step_rates(times: list[float], settings: StepSettings, sample_flops: float) -> dict[str, float]:
    """Samples, tokens and model TFLOPs per second at the median of the steps after `warmup`."""
    samples = settings.batch_size / statistics.median(times[settings.warmup :])
    return {
        "samples_per_second": samples,
        "tokens_per_second": samples * settings.seq_len,
        "tflops": samples * sample_flops / 1e12,
    }


def format_report(report: dict) -> str:
    """The report of any mode as the table the command prints."""
    if report["mode"] == "serve":
        return format_serve_report(report)
    if report.get("task") == SPEECH_TASK:
        return format_speech_report(report)
    if report["mode"] == "recipe":
        return format_recipe_report(report)
    if report["mode"] in LATENCY_MODES:
        return format_latency_report(report)
    return format_step_report(report)


__all__ = ["run_benchmark", "format_report", "MODES"]
