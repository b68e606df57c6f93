"""The official SQuAD v2.0 evaluation (Rajpurkar & Jia et al., https://rajpurkar.github.io/SQuAD-explorer/), ported.

Hand-written because no maintained package ships it installable offline: `evaluate.load("squad_v2")` fetches the
metric's script from the Hugging Face Hub at run time, and `torchmetrics`' SQuAD metric is the v1.1 one (no
`HasAns_*` / `NoAns_*` split, no best no-answer threshold). This is a faithful port of the official
`evaluate-v2.0.py` (the computation `evaluate`'s `squad_v2` metric wraps): same answer normalisation, the same
dropping of gold answers that normalise to nothing, the same no-answer threshold of 1.0 and the same best-threshold
search, so the keys and values are those of the upstream `run_qa.py --version_2_with_negative`: `exact`, `f1`,
`total`, `HasAns_exact`, `HasAns_f1`, `HasAns_total`, `NoAns_exact`, `NoAns_f1`, `NoAns_total`, `best_exact`,
`best_exact_thresh`, `best_f1`, `best_f1_thresh`.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, without punctuation, articles and extra whitespace (the official `normalize_answer`)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def compute_exact(gold: str, prediction: str) -> int:
    """1 when the normalised answers are equal, else 0."""
    return int(normalize_answer(gold) == normalize_answer(prediction))


def compute_f1(gold: str, prediction: str) -> float:
    """Token-overlap F1 of the normalised answers; an empty answer scores 1 against an empty one, else 0."""
    gold_tokens, pred_tokens = _tokens(gold), _tokens(prediction)
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _raw_scores(
    gold_answers: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> tuple[dict[str, int], dict[str, float]]:
    exact, f1 = {}, {}
    for qid, answers in gold_answers.items():
        golds = [a for a in answers if normalize_answer(a)] or [""]  # unanswerable: the only right answer is ""
        if qid not in predictions:
            continue  # the official script prints "Missing prediction" and leaves the question out of the raw scores
        prediction = predictions[qid]
        exact[qid] = max(compute_exact(a, prediction) for a in golds)
        f1[qid] = max(compute_f1(a, prediction) for a in golds)
    return exact, f1


def _apply_no_answer_threshold(
    scores: Mapping[str, float], na_probs: Mapping[str, float], has_answer: Mapping[str, bool], threshold: float
) -> dict[str, float]:
    return {qid: float(not has_answer[qid]) if na_probs[qid] > threshold else score for qid, score in scores.items()}


def _eval_dict(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str] | None = None) -> dict:
    if qids is None:
        total = len(exact)
        return {
            "exact": 100.0 * sum(exact.values()) / total,
            "f1": 100.0 * sum(f1.values()) / total,
            "total": total,
        }
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact[k] for k in qids) / total,
        "f1": 100.0 * sum(f1[k] for k in qids) / total,
        "total": total,
    }


def _best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    num_no_answer = sum(1 for k in has_answer if not has_answer[k])
    current = best = num_no_answer
    best_threshold = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        current += diff
        if current > best:
            best, best_threshold = current, na_probs[qid]
    return 100.0 * best / len(scores), best_threshold


def squad_v2_scores(
    predictions: Mapping[str, str],
    gold_answers: Mapping[str, Sequence[str]],
    no_answer_probabilities: Mapping[str, float] | None = None,
    no_answer_threshold: float = 1.0,
) -> dict[str, Any]:
    """
    The official SQuAD v2.0 scores, percentages between 0 and 100.

    Args:
        predictions (`Mapping[str, str]`): Question id -> predicted answer (`""` for "no answer").
        gold_answers (`Mapping[str, Sequence[str]]`): Question id -> reference answer texts (empty: unanswerable).
        no_answer_probabilities (`Mapping[str, float]`, *optional*): Question id -> the model's probability that
            it has no answer. Defaults to 0.0 for every prediction, as the upstream `run_qa.py` passes.
        no_answer_threshold (`float`, *optional*, defaults to 1.0): An answer is replaced by "no answer" when its
            no-answer probability exceeds this (the official default).

    Returns:
        `dict[str, Any]`: `exact`, `f1`, `total`; `HasAns_exact`, `HasAns_f1`, `HasAns_total` when some questions
        have an answer; `NoAns_*` likewise for unanswerable ones; `best_exact`, `best_exact_thresh`, `best_f1`,
        `best_f1_thresh`.

    Raises:
        `ValueError`: if there is no question, or a question has no prediction.
    """
    if not gold_answers:
        raise ValueError("squad_v2_scores needs at least one question")
    missing = sorted(set(gold_answers) - set(predictions))
    if missing:  # the official script fails on them with a KeyError in the HasAns/NoAns split
        raise ValueError(f"{len(missing)} of {len(gold_answers)} questions have no prediction, e.g. {missing[:3]}")
    na_probs = dict(no_answer_probabilities or dict.fromkeys(predictions, 0.0))
    has_answer = {qid: bool(answers) for qid, answers in gold_answers.items()}
    exact_raw, f1_raw = _raw_scores(gold_answers, predictions)
    exact = _apply_no_answer_threshold(exact_raw, na_probs, has_answer, no_answer_threshold)
    f1 = _apply_no_answer_threshold(f1_raw, na_probs, has_answer, no_answer_threshold)
    result = _eval_dict(exact, f1)
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [k for k, v in has_answer.items() if v is wanted]
        if qids:
            result.update({f"{prefix}_{k}": v for k, v in _eval_dict(exact, f1, qids).items()})
    result["best_exact"], result["best_exact_thresh"] = _best_threshold(predictions, exact_raw, na_probs, has_answer)
    result["best_f1"], result["best_f1_thresh"] = _best_threshold(predictions, f1_raw, na_probs, has_answer)
    return result
