"""The SQuAD requests that `optimum-ipu benchmark --mode latency | throughput` answers, their gold answers, and the
SQuAD v1.1 exact match and F1 of a runner's answers.

The requests come from a SQuAD v1.1 file (`OPTIMUM_IPU_SQUAD_FILE`, default `../shared/data/squad/`, the file the
shipped feature-length histogram was made from); without it, from that histogram (contexts of the same token
lengths, drawn from the tokenizer's vocabulary).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from .packing import load_feature_lengths, sample_feature_lengths

SQUAD_ENV = "OPTIMUM_IPU_SQUAD_FILE"
DEFAULT_SQUAD = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad" / "squad-v1.1-dev-articles-00-39.json"

Request = tuple[str, str]  # (question, context)


def squad_file() -> Path:
    """The SQuAD v1.1 file the requests come from: `$OPTIMUM_IPU_SQUAD_FILE`, else `DEFAULT_SQUAD`."""
    return Path(os.environ.get(SQUAD_ENV, DEFAULT_SQUAD))


def squad_questions(path: Path, articles: slice = slice(None)) -> list[tuple[Request, list[str]]]:
    """Every question of the SQuAD JSON file's `articles`, in the file's order: `((question, context), answers)`."""
    data = json.loads(path.read_text(encoding="utf-8"))["data"][articles]
    return [
        ((qa["question"], p["context"]), [a["text"] for a in qa["answers"]])
        for a in data
        for p in a["paragraphs"]
        for qa in p["qas"]
    ]


def vocabulary_words(tokenizer: Any) -> list[str]:
    """The tokenizer's whole ASCII words: what made-up questions and contexts are made of."""
    return [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii()]


def load_requests(count: int, tokenizer: Any, seed: int = 0) -> tuple[list[Request], str]:
    """`count` question/context pairs drawn (fixed seed) from the SQuAD file, or built from the shipped histogram's
    lengths when the file is absent; and where they came from."""
    path = squad_file()
    rng = random.Random(seed)
    if path.is_file():
        pairs = [request for request, _ in squad_questions(path)]
        return [pairs[i] for i in rng.sample(range(len(pairs)), min(count, len(pairs)))], f"SQuAD pairs of {path.name}"
    lengths = load_feature_lengths()
    words = vocabulary_words(tokenizer)
    requests = []
    for length in sample_feature_lengths(lengths["histogram"], count, lengths["max_length"], seed=seed):
        question = " ".join(rng.choice(words) for _ in range(10)) + "?"
        requests.append((question, " ".join(rng.choice(words) for _ in range(max(1, length - 13)))))
    return requests, f"contexts of the lengths of the shipped histogram ({lengths['source_file']}; {path} not found)"


def squad_answers() -> dict[Request, list[str]]:
    """The gold answers of every question of the SQuAD file, by (question, context); empty without the file."""
    path = squad_file()
    if not path.is_file():
        return {}
    return dict(squad_questions(path))


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


__all__ = [
    "SQUAD_ENV",
    "DEFAULT_SQUAD",
    "Request",
    "squad_file",
    "vocabulary_words",
    "squad_questions",
    "load_requests",
    "squad_answers",
    "exact_match_f1",
]
