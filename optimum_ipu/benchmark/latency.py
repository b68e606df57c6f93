"""`optimum-ipu benchmark --mode latency` (and `--mode throughput`): answering SQuAD questions end to end.

Every runner answers the same requests, real SQuAD question/context pairs, and is timed from the strings in to the
answer out (tokenization, forward, span selection), in one process, one runner at a time in rounds of
alternating order (runners taking turns request by request slow each other: see `measure_in_rounds`). The runners
are built in `qa_runners`, the requests drawn in `squad`, the report written by `latency_report`:

- ours: `optimum_ipu.pipelines.pipeline("question-answering", ...)` with its default backend (`--backends` adds
  others: `eager`, `compile`, `onnxruntime`, `onnxruntime-int8`);
- plain `transformers`: the model in eager PyTorch on inputs padded to `--seq-len`, as a user runs it (the
  tokenizer with `padding="max_length"`), with `run_qa.py`'s span selection (`utils_qa`'s loops);
- ONNX Runtime given its best settings: the same model exported with dynamic shapes, fused by ONNX Runtime's
  transformer optimizer, one intra-op thread per core, each request run at its own length, the same span
  selection as the `transformers` runner. When ours runs that exact graph (`auto` / `onnxruntime` on a CPU), this
  runner runs ours' very session, so that the two differ only by what each does around the model.

Each request's time is also split into the model's forward (`ModelClock`) and the rest (tokenization, batching,
span selection).

`--mode latency` sends one request at a time (batch 1) and reports p50 / p90 / p99 milliseconds and requests per
second; `--mode throughput` sends `--batch-size` requests at a time (offline scoring) and reports requests per
second. Each runner's answers are also scored against the SQuAD file's gold answers (exact match and F1), which is
how the int8 runner's accuracy cost shows with a fine-tuned model. The requests come from a SQuAD v1.1 file
(`OPTIMUM_IPU_SQUAD_FILE`, default `../shared/data/squad/`, the file the shipped feature-length histogram was made
from); without it, from that histogram (contexts of the same token lengths, drawn from the tokenizer's vocabulary).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..runtime.inference.runner import onnxruntime_available
from .arguments import check_integers
from .latency_report import latency_chart, latency_report
from .qa_runners import OUR_BACKENDS, Runner, build_model, doc_stride, eager_runner, onnxruntime_runner, ours_runner
from .report import write_report
from .squad import Request, load_requests

LATENCY_MODES = ("latency", "throughput")
PAUSE_S = 0.01  # between two timed calls: a request arrives at an idle server


def run_latency_benchmark(
    model: str = "bert-base-uncased-config",
    mode: str = "latency",
    seq_len: int = 384,
    requests: int = 300,
    warmup: int = 10,
    batch_size: int = 32,
    backends: tuple[str, ...] = ("auto",),
    ipu_config: str | None = None,
    output_dir: str = "benchmark_results",
    rounds: int = 4,
) -> dict[str, Any]:
    """Run ours, plain `transformers` eager and ONNX Runtime on the same SQuAD requests (see the module docstring);
    write `benchmark.json` and `benchmark.png` to `output_dir`; return the report.

    Args:
        model (`str`): a question-answering model folder, or an architecture name (random weights).
        mode (`str`): `"latency"` (batch 1) or `"throughput"` (`batch_size` requests a call).
        seq_len (`int`): the static length (windows of long contexts; the eager baseline pads to it).
        requests (`int`): timed requests (batches in throughput mode), after `warmup` untimed ones.
        backends (`tuple[str]`): our backends to run (`OUR_BACKENDS`), each its own runner.
        rounds (`int`): rounds of timing, every runner in turn (see `measure_in_rounds`).
    """
    check_latency_arguments(mode, seq_len, requests, warmup, backends, rounds)
    rows = 1 if mode == "latency" else batch_size
    net, tokenizer, model_name = build_model(model)
    batches, source = request_batches(tokenizer, seq_len, requests + warmup, rows)
    runners, eager_name, shares_session = latency_runners(net, tokenizer, seq_len, backends, ipu_config, rows)
    warmup = min(warmup, len(batches) - 1)
    measured = measure_in_rounds(runners, batches, warmup, rounds)
    report = latency_report(measured, model_name, mode, seq_len, rows, source, eager_name, tokenizer, batches[warmup:])
    report["onnxruntime_runs_ours_session"] = shares_session
    write_report(report, output_dir, latency_chart)
    return report


def check_latency_arguments(
    mode: str, seq_len: int, requests: int, warmup: int, backends: tuple[str, ...], rounds: int
) -> None:
    """Refuse, naming the flag, what a latency / throughput run cannot run."""
    if mode not in LATENCY_MODES:
        raise ValueError(f"--mode {mode!r}: expected one of {', '.join(LATENCY_MODES)}")
    unknown = [b for b in backends if b not in OUR_BACKENDS]
    if unknown:
        raise ValueError(f"backends: {unknown} unknown; expected some of {', '.join(OUR_BACKENDS)}")
    check_integers(
        (("--seq-len", seq_len, 64), ("--steps", requests, 1), ("--warmup", warmup, 0), ("rounds", rounds, 1))
    )


def request_batches(tokenizer: Any, seq_len: int, count: int, rows: int) -> tuple[list[list[Request]], str]:
    """`count` batches of `rows` requests (`load_requests`), and where they came from; questions that would leave
    no window longer than the stride are left out (the pipeline refuses them: rare at seq 384)."""
    pool, source = load_requests(2 * count * rows, tokenizer)
    room = seq_len - tokenizer.num_special_tokens_to_add(pair=True) - doc_stride(seq_len)
    pool = [(q, c) for q, c in pool if len(tokenizer(q.lstrip(), add_special_tokens=False)["input_ids"]) < room]
    pool = pool[: count * rows]
    return [pool[i : i + rows] for i in range(0, len(pool), rows)], source


def latency_runners(
    net: torch.nn.Module, tokenizer: Any, seq_len: int, backends: tuple[str, ...], ipu_config: str | None, rows: int
) -> tuple[dict[str, Runner], str, bool]:
    """Ours with each backend, then plain `transformers` eager, then ONNX Runtime where it is installed: the runners
    by name, the eager runner's name, and whether the ONNX Runtime runner runs ours' very session."""
    runners: dict[str, Runner] = {}
    for backend in backends:
        runner, name = ours_runner(net, tokenizer, seq_len, backend, ipu_config, rows)
        runners[name] = runner
    eager_name = f"transformers eager (padded to {seq_len})"
    runners[eager_name] = eager_runner(net, tokenizer, seq_len)
    if not onnxruntime_available():
        return runners, eager_name, False
    # where ours runs the exact fused graph, the ONNX Runtime runner runs that very session: two sessions of one
    # graph differ by up to 9% in p50 on a small VM by where their memory lands, which would swamp the
    # difference the comparison is about (the work around the model)
    ours = runners[next(iter(runners))][0]
    shared = getattr(ours, "session", None) if backends[0] in ("auto", "onnxruntime") else None
    runners["ONNX Runtime (fused graph, own length)"] = onnxruntime_runner(net, tokenizer, seq_len, shared)
    return runners, eager_name, shared is not None


def measure_in_rounds(
    runners: dict[str, Runner], batches: list[list[Request]], warmup: int, rounds: int
) -> dict[str, dict]:
    """Time every runner on every batch after its `warmup` untimed batches, one runner at a time: runners taking turns
    batch by batch slow each other down, because one runner's worker threads (ONNX Runtime's pools, OpenMP) still
    spin while the next one runs (measured on 2 cores shared with another job: the runner after ONNX Runtime took
    1.8x its time). `rounds` rounds, every other one in the reverse order, each timing every `rounds`-th batch, so
    that a drift of the machine's load falls on every runner alike. Answers are kept in the order of the batches."""
    names = list(runners)
    timed = list(range(warmup, len(batches)))
    times: dict[str, dict[int, float]] = {name: {} for name in names}
    model_times: dict[str, dict[int, float]] = {name: {} for name in names}
    answers: dict[str, dict[int, list[str]]] = {name: {} for name in names}
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            answer, clock = runners[name]
            for index in range(warmup):
                answer(batches[index])
            for index in timed[round_index::rounds]:
                time.sleep(PAUSE_S)
                in_model = clock.seconds
                start = time.perf_counter()
                result = answer(batches[index])
                times[name][index] = time.perf_counter() - start
                model_times[name][index] = clock.seconds - in_model
                answers[name][index] = result
    return {
        name: {
            "times": [times[name][i] for i in timed],
            "model_times": [model_times[name][i] for i in timed],
            "answers": [a for i in timed for a in answers[name][i]],
        }
        for name in names
    }


__all__ = ["LATENCY_MODES", "run_latency_benchmark", "measure_in_rounds"]
