"""Extractive question answering: the span selection shared with `examples/question-answering` (`run_qa.py`'s
post-processing calls `answer_span_candidates` and `nbest_with_probabilities`), and the `"question-answering"`
pipeline, which `transformers` 5 removed, with the outputs of its v4 pipeline (`{"score", "start", "end", "answer"}`).

A context longer than a window is split into features of `max_seq_length` tokens overlapping by `doc_stride`;
the best spans over all the features of an example win, as in `run_qa.py`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .base import StaticBatchingPipeline

Offsets = Sequence[tuple[int, int] | list[int] | None]
_EMPTY_ANSWER = {"score": 0.0, "start": 0, "end": 0, "answer": ""}  # no span at all (e.g. an empty context)


def span_candidate(offsets: tuple[int, int], start_logit: float, end_logit: float) -> dict[str, Any]:
    """One candidate answer: its character offsets in the context, its score (start + end logit) and logits."""
    # Plain floats (not np.float32) so that the n-best lists are JSON-serialisable as they are.
    return {
        "offsets": offsets,
        "score": float(start_logit + end_logit),
        "start_logit": float(start_logit),
        "end_logit": float(end_logit),
    }


# One candidate answer: (score, start logit, end logit, start char, end char); the null answer is (.., 0, 0).
Candidate = tuple[float, float, float, int, int]


def best_spans(
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    offset_mappings: Sequence[Offsets],
    n_best_size: int = 20,
    max_answer_length: int = 30,
    with_null: bool = False,
) -> tuple[list[Candidate], Candidate | None]:
    """`answer_span_candidates` as tuples (`Candidate`), without a dict per candidate: what one request's answer
    needs. Same arguments; returns the n best (best first, the null answer among them when `with_null`) and the
    null answer (`None` without features)."""
    null: Candidate | None = None
    candidates: list[Candidate] = []  # in the order of the loops of run_qa.py: features, best starts, best ends
    for feature_start, feature_end, offsets in zip(start_logits, end_logits, offset_mappings, strict=True):
        feature_start, feature_end = np.asarray(feature_start), np.asarray(feature_end)
        # the null answer is scored by each feature's first token (CLS), the lowest over the features: every
        # feature must agree that there is no answer
        cls_start, cls_end = float(feature_start[0]), float(feature_end[0])
        if null is None or null[0] > cls_start + cls_end:
            null = (cls_start + cls_end, cls_start, cls_end, 0, 0)
        candidates += _feature_spans(feature_start, feature_end, offsets, n_best_size, max_answer_length)
    if with_null and null is not None:
        candidates.append(null)
    nbest = sorted(candidates, key=_score, reverse=True)[:n_best_size]  # stable: ties keep the loops' order
    if with_null and null is not None and all(c is not null for c in nbest):
        nbest.append(null)  # the null answer must stay comparable even when it fell out of the n best
    return nbest, null


def _score(candidate: Candidate) -> float:
    return candidate[0]


def answer_span_candidates(
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    offset_mappings: Sequence[Offsets],
    n_best_size: int = 20,
    max_answer_length: int = 30,
    with_null: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The best answer spans of one example over all its features, from start/end logits.

    In each feature, the `n_best_size` best start and end positions are paired; a pair is a candidate when both ends
    are context tokens (an offset that is not `None`; positions past a feature's offsets, such as logits padded
    across batches, are not), the end is not before the start, and the span has at most `max_answer_length` tokens.

    Args:
        start_logits (`Sequence[np.ndarray]`): per feature, the start logit of each token.
        end_logits (`Sequence[np.ndarray]`): per feature, the end logit of each token.
        offset_mappings (`Sequence`): per feature, each token's `(start, end)` characters in the context, or `None`
            for tokens outside the context (question, special and padding tokens).
        n_best_size (`int`, *optional*, defaults to 20): positions tried per end, and candidates kept.
        max_answer_length (`int`, *optional*, defaults to 30): the longest answer, in tokens.
        with_null (`bool`, *optional*, defaults to `False`): make the null answer (offsets `(0, 0)`) a candidate
            (SQuAD v2, `handle_impossible_answer`).

    Returns:
        `tuple[list[dict], dict | None]`: the candidates (`span_candidate` dicts), best score first, at most
        `n_best_size` of them plus the null answer when `with_null` and it fell out of the n best; and the null
        answer, scored by the first token of each feature (CLS) and the lowest over the features, since every
        feature must agree that there is no answer (`None` without features).
    """
    nbest, null = best_spans(start_logits, end_logits, offset_mappings, n_best_size, max_answer_length, with_null)
    min_null = None if null is None else span_candidate((0, 0), null[1], null[2])
    # the null answer is the same dict as the one returned beside the candidates
    return [min_null if c is null else span_candidate((c[3], c[4]), c[1], c[2]) for c in nbest], min_null


def _feature_spans(
    start: np.ndarray, end: np.ndarray, offsets: Offsets, n_best_size: int, max_answer_length: int
) -> list[Candidate]:
    """One feature's candidate spans: the `n_best_size` best starts x the best ends (run_qa.py's loops), kept when
    both ends are context tokens, the end is not before the start and the span is at most `max_answer_length`
    tokens. A Python loop over at most `n_best_size`**2 pairs: on one request it is faster than numpy's calls."""
    start_indexes = np.argsort(start)[-1 : -n_best_size - 1 : -1]
    end_indexes = np.argsort(end)[-1 : -n_best_size - 1 : -1]
    known = len(offsets)
    ends = [
        (e, offsets[e][1], logit)
        for e, logit in zip(end_indexes.tolist(), end[end_indexes].tolist(), strict=True)
        if e < known and offsets[e] is not None
    ]
    spans = []
    for s, start_logit in zip(start_indexes.tolist(), start[start_indexes].tolist(), strict=True):
        if s >= known or offsets[s] is None:
            continue
        start_char = offsets[s][0]
        for e, end_char, end_logit in ends:
            if s <= e < s + max_answer_length:
                spans.append((start_logit + end_logit, start_logit, end_logit, start_char, end_char))
    return spans


def nbest_with_probabilities(nbest: list[dict[str, Any]], context: str) -> list[dict[str, Any]]:
    """Turn candidates into answers: each gets its `text` from the context and a `probability` (softmax of the
    scores over the n best); `offsets` and `score` are popped. With no span at all (e.g. an empty context), a
    placeholder answer `"empty"` (no offsets) keeps the list and the softmax well defined, as in `transformers`'
    examples. The dicts are changed in place and returned, best first."""
    for candidate in nbest:
        offsets = candidate.pop("offsets")
        candidate["text"] = context[offsets[0] : offsets[1]]
    if len(nbest) == 0 or (len(nbest) == 1 and nbest[0]["text"] == ""):
        nbest.insert(0, {"text": "empty", "start_logit": 0.0, "end_logit": 0.0, "score": 0.0})
    # Softmax with the max subtracted, for numerical stability.
    scores = np.array([candidate.pop("score") for candidate in nbest])
    exp_scores = np.exp(scores - np.max(scores))
    for probability, candidate in zip(exp_scores / exp_scores.sum(), nbest, strict=True):
        candidate["probability"] = float(probability)
    return nbest


# The model inputs a `tokenizers` encoding holds, by their `transformers` names.
_ENCODING_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}
# Where `transformers` turns a call into `tokenizers`' `encode_batch`: a class that redefines one of them does more.
_ENCODE_PATH = (
    "__call__",
    "_call_one",
    "encode_plus",
    "_encode_plus",
    "set_truncation_and_padding",
    "_convert_encoding",
)


def encode_windows(tokenizer: Any, pair: tuple[str, str], truncation: str, max_length: int, stride: int) -> list[Any]:
    """A question/context pair's windows of at most `max_length` tokens overlapping by `stride` (the first, then its
    overflowing ones), as `tokenizers` encodings (`ids`, `type_ids`, `attention_mask`, `offsets`,
    `sequence_ids`): what `tokenizer(*pair, truncation=..., max_length=..., stride=...,
    return_overflowing_tokens=True, return_offsets_mapping=True)` returns, without turning every window into
    Python lists and a `BatchEncoding` (a third of a request's time around the model on a CPU). A tokenizer whose
    class changes how `transformers` encodes, or whose model inputs are not the encoding's, takes that call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not _encodes_as_transformers(type(tokenizer)):
        encoded = tokenizer(
            *pair,
            truncation=truncation,
            max_length=max_length,
            stride=stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )
        return list(encoded.encodings)
    # the backend's settings exactly as transformers' set_truncation_and_padding leaves them for this call
    target = {
        "max_length": max_length,
        "stride": stride,
        "strategy": truncation,
        "direction": tokenizer.truncation_side,
    }
    current = backend.truncation
    if current is None or any(current.get(k) != v for k, v in target.items()):
        backend.enable_truncation(**target)
    if backend.padding is not None:
        backend.no_padding()
    if backend.encode_special_tokens != tokenizer.split_special_tokens:
        backend.encode_special_tokens = tokenizer.split_special_tokens
    encoding = backend.encode(*pair, add_special_tokens=True)
    return [encoding, *encoding.overflowing]


@functools.cache
def _encodes_as_transformers(cls: type) -> bool:
    """Whether `cls` encodes through `transformers`' own `tokenizers` path, with model inputs an encoding holds."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    if not issubclass(cls, TokenizersBackend):
        return False
    if not set(getattr(cls, "model_input_names", ())) <= set(_ENCODING_FIELDS):
        return False
    for klass in cls.__mro__[: cls.__mro__.index(TokenizersBackend)]:
        if any(name in vars(klass) for name in _ENCODE_PATH):
            return False
    return PreTrainedTokenizerBase in cls.__mro__


class IPUQuestionAnsweringPipeline(StaticBatchingPipeline):
    """Extractive question answering (task `"question-answering"`) at static shapes, with the span selection of
    `run_qa.py` (`answer_span_candidates`).

    Call it as `transformers`' v4 pipeline: `qa(question=..., context=...)`, `qa({"question": ..., "context":
    ...})`, a list of such dicts, or `question=[...], context=[...]`. Each answer is `{"score", "start", "end",
    "answer"}`: `answer == context[start:end]` and `score` its probability among the n best (softmax over start +
    end logits, as `run_qa.py`'s `nbest_predictions.json`); with `top_k > 1`, a list of the best `top_k`.

    Call parameters:
        top_k (`int`, defaults to 1): answers returned per question.
        doc_stride (`int`, defaults to 128, capped to half of `max_seq_length`): tokens shared by two consecutive
            windows of a long context.
        max_answer_len (`int`, defaults to 15): the longest answer, in tokens.
        handle_impossible_answer (`bool`, defaults to `False`): the empty answer (`start == end == 0`) competes
            with the spans, as SQuAD v2's null answer.
        n_best_size (`int`, defaults to 20): start and end positions tried per feature (at least `top_k`).
        max_seq_len: `transformers` v4's name of `max_seq_length`, which is fixed when the pipeline is built
            (static shapes); a different value is an error.
    """

    model_mapping = "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"
    default_max_seq_length = 384
    array_outputs = True  # the logits go to numpy span selection: ONNX Runtime's arrays are not made tensors
    chunked = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Answer one question (`question=`, `context=`), a dict, or a list of them; see the class docstring."""
        question, context = kwargs.pop("question", None), kwargs.pop("context", None)
        if args and (question is not None or context is not None):
            raise ValueError("give the inputs either as arguments or as question=/context=, not both")
        if len(args) == 2 and all(isinstance(a, str) for a in args):
            question, context = args
            args = ()
        if args:
            inputs = args[0]
            if len(args) > 1:
                raise ValueError(
                    f"expected one input (a dict or a list of dicts), got {len(args)} positional arguments"
                )
        elif question is None or context is None:
            raise ValueError("question-answering needs a question and a context: qa(question=..., context=...)")
        elif isinstance(question, list) or isinstance(context, list):
            questions = question if isinstance(question, list) else [question] * len(context)
            contexts = context if isinstance(context, list) else [context] * len(questions)
            if len(questions) != len(contexts):
                raise ValueError(f"question: {len(questions)} questions for {len(contexts)} contexts; give as many")
            inputs = [{"question": q, "context": c} for q, c in zip(questions, contexts, strict=True)]
        else:
            inputs = {"question": question, "context": context}
        return super().__call__(inputs, **kwargs)

    def _sanitize_parameters(
        self,
        top_k: int | None = None,
        doc_stride: int | None = None,
        max_answer_len: int | None = None,
        handle_impossible_answer: bool | None = None,
        n_best_size: int | None = None,
        max_seq_len: int | None = None,
    ) -> tuple[dict, dict, dict]:
        if max_seq_len is not None and max_seq_len != self.max_seq_length:
            raise ValueError(
                f"max_seq_len={max_seq_len}: the pipeline pads every window to max_seq_length={self.max_seq_length}, "
                "fixed when it is built; pass max_seq_length to pipeline() instead"
            )
        for name, value in (("top_k", top_k), ("doc_stride", doc_stride), ("max_answer_len", max_answer_len)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: got {value!r}; expected a positive integer")
        preprocess = {} if doc_stride is None else {"doc_stride": doc_stride}
        postprocess: dict[str, Any] = {}
        for name, value in (
            ("top_k", top_k),
            ("max_answer_len", max_answer_len),
            ("handle_impossible_answer", handle_impossible_answer),
            ("n_best_size", n_best_size),
        ):
            if value is not None:
                postprocess[name] = value
        return preprocess, {}, postprocess

    def preprocess(self, example: Any, doc_stride: int | None = None) -> Iterator[dict[str, Any]]:
        if not isinstance(example, dict) or not isinstance(example.get("question"), str):
            raise ValueError(f"question-answering: expected {{'question': str, 'context': str}}, got {example!r:.100}")
        if not isinstance(example.get("context"), str):
            raise ValueError(f"question-answering: 'context' must be a string, got {example.get('context')!r:.100}")
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(f"{type(self.tokenizer).__name__} is not a fast tokenizer: offsets need one")
        doc_stride = min(128, self.max_seq_length // 2) if doc_stride is None else doc_stride
        # Models padded on the left take the context first (as run_qa.py's features).
        pad_on_right = self.tokenizer.padding_side == "right"
        question = example["question"].lstrip()  # leading spaces waste room in the window
        room = self.max_seq_length - self.tokenizer.num_special_tokens_to_add(pair=True) - doc_stride
        # A token covers at least one byte of UTF-8: a question of fewer bytes than the room needs no count.
        q_len = len(question.encode())
        if q_len >= room:
            q_len = len(self.tokenizer(question, add_special_tokens=False)["input_ids"])
        if q_len >= room:
            # tokenizers would panic (an error `except Exception` cannot catch); say what to change instead
            raise ValueError(
                f"the question {question!r:.60} takes {q_len} tokens, which leaves no context window longer than "
                f"doc_stride={doc_stride} in max_seq_length={self.max_seq_length}; lower doc_stride or raise "
                "max_seq_length"
            )
        pair = (question, example["context"]) if pad_on_right else (example["context"], question)
        truncation = "only_second" if pad_on_right else "only_first"
        # not padded here: each batch is padded to its bucket (or its own length) when collated
        windows = encode_windows(self.tokenizer, pair, truncation, self.max_seq_length, doc_stride)
        context_index = 1 if pad_on_right else 0
        for window in windows:
            # run_qa.py's offsets: None outside the context (question, special and padding tokens)
            pairs = zip(window.offsets, window.sequence_ids, strict=True)
            offsets = [offset if sequence == context_index else None for offset, sequence in pairs]
            # numpy arrays: ONNX Runtime reads them as they are; collate makes tensors of them for the engine
            features = {
                name: np.asarray([getattr(window, _ENCODING_FIELDS[name])], dtype=np.int64)
                for name in self.tokenizer.model_input_names
                if name in _ENCODING_FIELDS
            }
            yield {**features, "offset_mapping": offsets, "context": example["context"]}

    def _forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        model_inputs = {k: v for k, v in inputs.items() if isinstance(v, (torch.Tensor, np.ndarray))}
        outputs = self.run_model(model_inputs)
        passed_on = {key: inputs[key] for key in ("offset_mapping", "context")}
        return {"start_logits": outputs["start_logits"], "end_logits": outputs["end_logits"], **passed_on}

    def postprocess(
        self,
        all_outputs: list[dict[str, Any]],
        top_k: int = 1,
        max_answer_len: int = 15,
        handle_impossible_answer: bool = False,
        n_best_size: int = 20,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        # Each window's logits at its own tokens only: the padding of its batch (its bucket) changes no answer.
        lengths = [len(o["offset_mapping"]) for o in all_outputs]
        nbest, _ = best_spans(
            [_logits(o["start_logits"], n) for o, n in zip(all_outputs, lengths, strict=True)],
            [_logits(o["end_logits"], n) for o, n in zip(all_outputs, lengths, strict=True)],
            [o["offset_mapping"] for o in all_outputs],
            n_best_size=max(n_best_size, top_k),
            max_answer_length=max_answer_len,
            with_null=handle_impossible_answer,
        )
        # The probabilities of nbest_with_probabilities (softmax over the n best), text only for the answers returned.
        context = all_outputs[0]["context"]
        if not nbest:
            return dict(_EMPTY_ANSWER) if top_k == 1 else [dict(_EMPTY_ANSWER)]
        scores = [c[0] for c in nbest]
        if len(nbest) == 1 and context[nbest[0][3] : nbest[0][4]] == "":
            scores.insert(0, 0.0)  # the placeholder answer "empty" leads the softmax, as in run_qa.py
        top = max(scores)
        weights = [math.exp(score - top) for score in scores]
        total = sum(weights)
        probabilities = weights[len(scores) - len(nbest) :]
        results = [
            {"score": weight / total, "start": c[3], "end": c[4], "answer": context[c[3] : c[4]]}
            for weight, c in zip(probabilities[:top_k], nbest[:top_k], strict=True)
        ]
        return results[0] if top_k == 1 else results


def _logits(value: Any, length: int) -> np.ndarray:
    """A window's logits (a batch of one, a tensor or an array) at its first `length` tokens, as an array."""
    row = value[0, :length]
    return row.numpy() if isinstance(row, torch.Tensor) else np.asarray(row)
