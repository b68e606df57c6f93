"""The SQuAD exact match and F1 of our `pipeline()` with each backend on whole articles of the SQuAD file: the
accuracy cost of a backend (int8 above all), measured on a fine-tuned model.

    python -m optimum_ipu.benchmark.squad_accuracy MODEL_DIR [--articles 34:40] [--backends ...] [--seq-len 384]
"""

from __future__ import annotations

import argparse
import json

from .qa_runners import OUR_BACKENDS, build_model, ours_runner
from .squad import SQUAD_ENV, exact_match_f1, squad_answers, squad_file, squad_questions


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
    path = squad_file()
    if not path.is_file():
        raise ValueError(f"{path}: no SQuAD file; set {SQUAD_ENV} to a SQuAD v1.1 JSON file")
    requests = [request for request, _ in squad_questions(path, slice(*articles))]
    requests = requests[:max_questions]
    net, tokenizer, _ = build_model(model)
    gold, scores = squad_answers(), {}
    for backend in backends:
        (answer, _), _ = ours_runner(net, tokenizer, seq_len, backend, None, batch_size)
        answers = [a for i in range(0, len(requests), batch_size) for a in answer(requests[i : i + batch_size])]
        scores[backend] = exact_match_f1(answers, requests, gold)
    return scores


def main(argv: list[str] | None = None) -> int:
    """`python -m optimum_ipu.benchmark.squad_accuracy MODEL_DIR [--articles 34:40] [--backends ...]`: the SQuAD
    EM/F1 of each backend (see `squad_accuracy`), printed and returned in JSON."""
    parser = argparse.ArgumentParser(description=squad_accuracy.__doc__)
    parser.add_argument("model", help="a fine-tuned question-answering model folder")
    parser.add_argument("--articles", default="34:40", help="START:END of the SQuAD file's articles")
    parser.add_argument("--backends", nargs="+", default=["onnxruntime", "onnxruntime-int8"], choices=OUR_BACKENDS)
    parser.add_argument("--seq-len", type=int, default=384)
    args = parser.parse_args(argv)
    start, end = (int(x) for x in args.articles.split(":"))
    print(json.dumps(squad_accuracy(args.model, tuple(args.backends), (start, end), args.seq_len), indent=2))
    return 0


__all__ = ["squad_accuracy", "main"]


if __name__ == "__main__":
    raise SystemExit(main())
