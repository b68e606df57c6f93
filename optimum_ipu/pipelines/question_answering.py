"""Extractive question answering: the span selection shared with `examples/question-answering` (`run_qa.py`'s
post-processing calls `answer_span_candidates` and `nbest_with_probabilities`), and the `"question-answering"`
pipeline, which `transformers` 5 removed, with the outputs of its v4 pipeline (`{"score", "start", "end", "answer"}`).

A context longer than a window is split into features of `max_seq_length` tokens overlapping by `doc_stride`;
the best spans over all the features of an example win, as in `run_qa.py`.
"""

from __future__ import annotations

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
            for tokens outside the context (question, special and padding tokens); or an array of shape
            `(tokens, 2)` with `-1` for them.
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
    min_null = None
    # Every feature's candidates as arrays (scores, logits, character offsets), in the order of the loops of
    # run_qa.py (features, then the best starts, then the best ends): the n best are picked by one stable sort.
    columns: list[tuple[np.ndarray, ...]] = []
    for feature_start, feature_end, offset_mapping in zip(start_logits, end_logits, offset_mappings, strict=True):
        feature_start, feature_end = np.asarray(feature_start), np.asarray(feature_end)
        feature_null = span_candidate((0, 0), feature_start[0], feature_end[0])
        if min_null is None or min_null["score"] > feature_null["score"]:
            min_null = feature_null
        columns.append(_feature_spans(feature_start, feature_end, offset_mapping, n_best_size, max_answer_length))
    with_null = with_null and min_null is not None
    scores, starts, ends, chars = (
        (np.concatenate(c) for c in zip(*columns, strict=True)) if columns else [np.zeros(0)] * 4
    )
    if with_null:
        scores = np.append(scores, min_null["score"])
    order = np.argsort(-scores, kind="stable")[:n_best_size]  # best first; ties keep the loops' order
    nbest = []
    for index in order.tolist():
        if with_null and index == len(scores) - 1:
            nbest.append(min_null)
        else:
            offsets = (int(chars[index, 0]), int(chars[index, 1]))
            nbest.append(span_candidate(offsets, starts[index], ends[index]))
    # The null answer must stay comparable even when it fell out of the n best.
    if with_null and all(c is not min_null for c in nbest):
        nbest.append(min_null)
    return nbest, min_null


def _feature_spans(
    start: np.ndarray, end: np.ndarray, offset_mapping: Offsets, n_best_size: int, max_answer_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One feature's candidate spans, vectorized: the `n_best_size` best starts x the best ends, kept when both
    ends are context tokens, the end is not before the start and the span is at most `max_answer_length` tokens.
    Returns their scores, start logits, end logits and `(start char, end char)` rows, start-major."""
    start_indexes = np.argsort(start)[-1 : -n_best_size - 1 : -1]
    end_indexes = np.argsort(end)[-1 : -n_best_size - 1 : -1]
    if isinstance(offset_mapping, np.ndarray):  # the pipeline's: (tokens, 2), -1 outside the context
        chars = np.full((len(start), 2), -1, dtype=np.int64)
        known = min(len(start), len(offset_mapping))
        chars[:known] = offset_mapping[:known]
        in_context = chars[:, 0] >= 0
    else:
        in_context = np.zeros(len(start), dtype=bool)
        chars = np.zeros((len(start), 2), dtype=np.int64)
        for k, offset in enumerate(offset_mapping[: len(start)]):
            if offset is not None:
                in_context[k] = True
                chars[k] = offset[0], offset[1]
    s, e = start_indexes[:, None], end_indexes[None, :]
    valid = in_context[s] & in_context[e] & (e >= s) & (e - s + 1 <= max_answer_length)
    rows, cols = np.nonzero(valid)  # row-major: start-major, as the loops of run_qa.py
    s, e = start_indexes[rows], end_indexes[cols]
    starts, ends = start[s], end[e]
    return (starts + ends).astype(np.float64), starts, ends, np.stack([chars[s, 0], chars[e, 1]], axis=1)


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
        encoded = self.tokenizer(
            *pair,
            truncation="only_second" if pad_on_right else "only_first",
            max_length=self.max_seq_length,
            stride=doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )  # not padded here: each batch is padded to its bucket (or its own length) when collated
        context_index = 1 if pad_on_right else 0
        names = [n for n in self.tokenizer.model_input_names if n in encoded]
        for i in range(len(encoded["input_ids"])):
            # offsets as an array, -1 outside the context: what answer_span_candidates reads without a loop
            in_context = np.array([s == context_index for s in encoded.sequence_ids(i)])
            offsets = np.where(in_context[:, None], np.asarray(encoded["offset_mapping"][i]), -1)
            features = {name: torch.from_numpy(np.asarray([encoded[name][i]], dtype=np.int64)) for name in names}
            yield {**features, "offset_mapping": offsets, "context": example["context"]}

    def _forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        model_inputs = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
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
        candidates, _ = answer_span_candidates(
            [o["start_logits"][0, :n].numpy() for o, n in zip(all_outputs, lengths, strict=True)],
            [o["end_logits"][0, :n].numpy() for o, n in zip(all_outputs, lengths, strict=True)],
            [o["offset_mapping"] for o in all_outputs],
            n_best_size=max(n_best_size, top_k),
            max_answer_length=max_answer_len,
            with_null=handle_impossible_answer,
        )
        # The probabilities of nbest_with_probabilities (softmax over the n best), text only for the answers returned.
        context = all_outputs[0]["context"]
        if not candidates:
            return dict(_EMPTY_ANSWER) if top_k == 1 else [dict(_EMPTY_ANSWER)]
        scores = np.array([c["score"] for c in candidates])
        first = candidates[0]["offsets"]
        placeholder = len(candidates) == 1 and context[first[0] : first[1]] == ""  # its "empty" leads the softmax
        if placeholder:
            scores = np.array([0.0, scores[0]])
        exp_scores = np.exp(scores - np.max(scores))
        probabilities = (exp_scores / exp_scores.sum())[1:] if placeholder else exp_scores / exp_scores.sum()
        results = [
            {"score": float(p), "start": int(c["offsets"][0]), "end": int(c["offsets"][1]), "answer": ""}
            for p, c in zip(probabilities[:top_k], candidates[:top_k], strict=True)
        ]
        for result in results:
            result["answer"] = context[result["start"] : result["end"]]
        return results[0] if top_k == 1 else results[:top_k]
