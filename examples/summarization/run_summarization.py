#!/usr/bin/env python
"""Fine-tune a sequence-to-sequence model (T5, ...) for summarization with `IPUSeq2SeqTrainer`, scored by ROUGE.

The flags of the `transformers` example of the same name, plus `--ipu_config_name`. From this folder (it reads
`./ipu_config.json`), T5 on XSum:

    python run_summarization.py --ipu_config_name=./ --model_name_or_path t5-small --do_train --do_eval \\
      --dataset_name xsum --source_prefix "summarize: " --output_dir output --overwrite_output_dir \\
      --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --pad_to_max_length \\
      --max_source_length 512 --max_target_length 64 --predict_with_generate

Data: `--dataset_name` (downloaded from the Hugging Face Hub, then read from the local `datasets` cache), or
`--train_file` / `--validation_file` / `--test_file` in CSV or JSON lines (`{"document": ..., "summary": ...}` for XSum;
the columns are `--text_column` and `--summary_column`, by default the dataset's known pair or the first two columns).
ROUGE as the upstream recipe computes it (`evaluate`'s `rouge` metric): `rouge-score` with Porter stemming, the
bootstrap aggregate's mid F-measure x 100 for `rouge1`, `rouge2`, `rougeL` and `rougeLsum`, the last on texts split
into sentences by `nltk.sent_tokenize` (its `punkt_tab` data: `python -m nltk.downloader punkt_tab`; without it, an
untrained Punkt splitter, with a warning). Writes `train_results.json`, `eval_results.json` (`eval_rouge1`, ...,
`eval_gen_len`), `all_results.json`, with `--do_predict --predict_with_generate` `generated_predictions.txt`, and
after training `training_curves.png`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import functools
import logging
from dataclasses import dataclass, field

import datasets
from example_utils import seq2seq
from rouge_score import rouge_scorer, scoring
from transformers import set_seed

from optimum_ipu import IPUSeq2SeqTrainingArguments
from optimum_ipu.errors import run_script

logger = logging.getLogger(__name__)

LOCAL_FILES_HINT = (
    "--train_file train.json --validation_file validation.json (JSON lines or CSV with a text and a summary column, "
    "e.g. XSum's document and summary)"
)
ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")

# (text column, summary column) of known data sets, as in the transformers example
summarization_name_mapping = {
    "amazon_reviews_multi": ("review_body", "review_title"),
    "big_patent": ("description", "abstract"),
    "cnn_dailymail": ("article", "highlights"),
    "orange_sum": ("text", "summary"),
    "pn_summary": ("article", "summary"),
    "psc": ("extract_text", "summary_text"),
    "samsum": ("dialogue", "summary"),
    "thaisum": ("body", "summary"),
    "xglue": ("news_body", "news_title"),
    "xsum": ("document", "summary"),
    "wiki_summary": ("article", "highlights"),
    "multi_news": ("document", "summary"),
}


@dataclass
class DataTrainingArguments(seq2seq.Seq2SeqDataArguments):
    """What data to train and evaluate on, and how to tokenize it."""

    lang: str | None = field(default=None, metadata={"help": "Language id (multilingual tokenizers)."})
    text_column: str | None = field(default=None, metadata={"help": "Column of the full texts."})
    summary_column: str | None = field(default=None, metadata={"help": "Column of the summaries."})
    train_file: str | None = field(default=None, metadata={"help": "Training data (CSV or JSON lines)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data (CSV or JSON lines)."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data (CSV or JSON lines)."})
    num_beams: int | None = field(default=1, metadata={"help": "Beams of generate() in evaluate and predict."})
    source_prefix: str | None = field(default=None, metadata={"help": "Text put before every source (T5: summarize)."})

    def __post_init__(self) -> None:
        super().__post_init__()
        files = (self.train_file, self.validation_file, self.test_file)
        if self.dataset_name is None and not any(files):
            raise ValueError("give --dataset_name or --train_file/--validation_file/--test_file (CSV or JSON lines)")
        for flag, path in zip(("--train_file", "--validation_file", "--test_file"), files, strict=True):
            if path is not None and not path.endswith((".csv", ".json", ".jsonl")):
                raise ValueError(f"{flag} {path}: expected a .csv, .json or .jsonl file")


def load_raw_datasets(data: DataTrainingArguments, model: example_utils.ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation / test examples, from local files or the Hugging Face Hub (or its local cache)."""
    files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}
    if any(files.values()):
        example_utils.require_files(files)
        loaded = {}
        for split, path in files.items():
            if path:
                kind = "csv" if path.endswith(".csv") else "json"
                loaded[split] = datasets.load_dataset(kind, data_files={split: path}, cache_dir=model.cache_dir)[split]
        return loaded
    return dict(
        example_utils.load_hub_dataset(
            data.dataset_name,
            data.dataset_config_name,
            local_files_hint=LOCAL_FILES_HINT,
            cache_dir=model.cache_dir,
            token=model.token,
        )
    )


def pick_column(given: str | None, default: str, columns: list[str], flag: str) -> str:
    name = given or default
    if name not in columns:
        raise ValueError(f"{flag} '{name}' needs to be one of: {', '.join(columns)}")
    return name


def text_and_summary_columns(raw: dict[str, datasets.Dataset], data_args: DataTrainingArguments) -> tuple[str, str]:
    """`--text_column` / `--summary_column`, by default the known pair of the dataset or its first two columns."""
    column_names = next(iter(raw.values())).column_names
    known = summarization_name_mapping.get(data_args.dataset_name or "")
    defaults = known or (column_names[0], column_names[1] if len(column_names) > 1 else column_names[0])
    text_column = pick_column(data_args.text_column, defaults[0], column_names, "--text_column")
    return text_column, pick_column(data_args.summary_column, defaults[1], column_names, "--summary_column")


@functools.cache
def sentence_splitter():
    """`nltk.sent_tokenize` as upstream (its `punkt_tab` data); without the data, an untrained Punkt splitter."""
    import nltk
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    try:
        nltk.data.find("tokenizers/punkt_tab")
        return nltk.sent_tokenize
    except LookupError:
        logger.warning(
            "nltk's punkt_tab data is not installed (python -m nltk.downloader punkt_tab): rougeLsum splits "
            "sentences with an untrained Punkt splitter, which may differ from upstream on abbreviations"
        )
        return PunktSentenceTokenizer().tokenize


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """
    ROUGE as upstream `run_summarization.py` scores it through `evaluate`'s `rouge` metric: `rouge-score` with
    stemming, each text's sentences on their own lines for `rougeLsum`, and the mid F-measure of the bootstrap
    aggregate, x 100.
    """
    split = sentence_splitter()
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    aggregator = scoring.BootstrapAggregator()
    for prediction, reference in zip(predictions, references, strict=True):
        aggregator.add_scores(scorer.score("\n".join(split(reference)), "\n".join(split(prediction))))
    result = aggregator.aggregate()
    return {key: result[key].mid.fmeasure * 100 for key in ROUGE_KEYS}


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        example_utils.ModelArguments, DataTrainingArguments, IPUSeq2SeqTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    seq2seq.warn_missing_t5_prefix(model_args, data_args, "summarize: ")
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)
    splits = seq2seq.wanted_splits(raw, training_args)
    text_column, summary_column = text_and_summary_columns({s: raw[s] for s in splits} or raw, data_args)

    def pairs(examples: dict[str, list]) -> tuple[list[str], list[str]]:
        # pairs with a missing text or summary are dropped
        kept = [(t, s) for t, s in zip(examples[text_column], examples[summary_column], strict=True) if t and s]
        return [t for t, _ in kept], [s for _, s in kept]

    seq2seq.run(model_args, data_args, training_args, raw, pairs, rouge, last_checkpoint)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
