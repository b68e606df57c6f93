#!/usr/bin/env python
"""Fine-tune a `transformers` model for token classification (NER, POS, chunking) with `IPUTrainer`.

The recipe of Optimum Graphcore's `run_ner.py`, run from this folder (it reads `./ipu_config.json`):

    python run_ner.py --ipu_config_name=./ --model_name_or_path bert-base-uncased \\
      --dataset_name lhoestq/conll2003 --do_train --do_eval --max_seq_length 128 --output_dir ./output/conll2003/

`lhoestq/conll2003` is CoNLL-2003 in Parquet files on the Hugging Face Hub (downloaded once, then read from the local
datasets cache): the Hub's `conll2003` is a loading script, which `datasets` 4 and later no longer run. Without a
network, give local files instead of `--dataset_name`: `--train_file` / `--validation_file` / `--test_file` take
CSV or JSON (lines) with one example per row: a list of words (`--text_column_name`, default `tokens`, else the
first column) and a list of their labels (`--label_column_name`, default `{task_name}_tags`, else the second
column), as strings (the label list is collected from the data) or class ids of a ClassLabel.
Entity-level precision / recall / F1 and token accuracy come from `seqeval`. Writes `train_results.json`,
`eval_results.json` and `all_results.json` (`eval_precision`, `eval_recall`, `eval_f1`, `eval_accuracy`) and, after
training, `training_curves.png`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score
from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    EvalPrediction,
    PretrainedConfig,
    default_data_collator,
    set_seed,
)

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script

logger = logging.getLogger(__name__)

FILE_FORMATS = ("csv", "json", "jsonl")
IGNORE_INDEX = -100  # the label of special tokens and of the non-first tokens of a word: left out of the loss


@dataclass
class ModelArguments(example_utils.ModelArguments):
    """Which model, config and tokenizer to fine-tune."""

    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a model whose classification head has another number of labels."}
    )


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize it."""

    task_name: str = field(default="ner", metadata={"help": "The task (ner, pos, chunk): names the label column."})
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Dataset id on the Hugging Face Hub (e.g. lhoestq/conll2003), or a local dataset folder."},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: CSV or JSON(L)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same formats."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data, same formats."})
    text_column_name: str | None = field(default=None, metadata={"help": "Column of the word lists."})
    label_column_name: str | None = field(default=None, metadata={"help": "Column of the label lists."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_seq_length: int | None = field(
        default=None, metadata={"help": "Tokens per example; default: the longest the tokenizer and model take."}
    )
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every example to max_seq_length (static shapes, one compiled graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep this many prediction examples."})
    label_all_tokens: bool = field(
        default=False,
        metadata={"help": "Label every token of a word (B- becomes I- after the first), not only the first."},
    )
    return_entity_level_metrics: bool = field(
        default=False, metadata={"help": "Report precision/recall/F1 of each entity type too, not only overall."}
    )

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("give --dataset_name or --train_file/--validation_file (CSV or JSON)")
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and path.rsplit(".", 1)[-1].lower() not in FILE_FORMATS:
                raise ValueError(f"--{name} {path}: expected a {', '.join(FILE_FORMATS)} file")
        self.task_name = self.task_name.lower()


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation / test splits, from local files or the Hugging Face Hub (or its local cache)."""
    files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}
    if any(files.values()):
        return example_utils.load_data_files(files, model.cache_dir)
    hint = "--train_file train.json --validation_file validation.json (JSON lines of tokens and ner_tags lists)"
    raw = example_utils.load_hub_dataset(
        data.dataset_name, data.dataset_config_name, local_files_hint=hint, cache_dir=model.cache_dir, token=model.token
    )
    return dict(raw)


def pick_column(given: str | None, default: str, position: int, columns: list[str], flag: str) -> str:
    """The column `--flag` names, else `default` if the data has it, else the one at `position` (as `transformers`'
    run_ner.py does); a clear error when it is not there."""
    if given is not None:
        if given not in columns:
            raise ValueError(f"--{flag} {given}: the data has no such column (columns: {', '.join(columns)})")
        return given
    if default in columns:
        return default
    if len(columns) <= position:
        raise ValueError(f"the data has {len(columns)} column(s) ({', '.join(columns)}); give --{flag}")
    return columns[position]


def seqeval_metrics(label_list: list[str], entity_level: bool) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics`: entity-level micro precision / recall / F1 and token accuracy from `seqeval` (the keys of
    the `seqeval` metric `transformers`' run_ner.py reports), on the first token of each word."""

    def compute(p: EvalPrediction) -> dict[str, float]:
        logits = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        predictions = np.argmax(logits, axis=2)
        y_true, y_pred = [], []
        for prediction, label in zip(predictions, p.label_ids, strict=True):
            kept = [
                (label_list[pr], label_list[la]) for pr, la in zip(prediction, label, strict=True) if la != IGNORE_INDEX
            ]
            y_pred.append([pr for pr, _ in kept])
            y_true.append([la for _, la in kept])
        overall = {
            "precision": precision_score(y_true, y_pred, zero_division=0),
            "recall": recall_score(y_true, y_pred, zero_division=0),
            "f1": f1_score(y_true, y_pred, zero_division=0),
            "accuracy": accuracy_score(y_true, y_pred),
        }
        if not entity_level:
            return {key: float(value) for key, value in overall.items()}
        results = {f"overall_{key}": float(value) for key, value in overall.items()}
        report = classification_report(y_true, y_pred, output_dict=True, zero_division=0)
        for entity, scores in report.items():
            if entity.endswith(" avg"):
                continue
            for key, name in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score")):
                results[f"{entity}_{key}"] = float(scores[name])
            results[f"{entity}_number"] = int(scores["support"])
        return results

    return compute


def resolve_columns(raw: dict[str, datasets.Dataset], data_args: DataTrainingArguments) -> tuple[str, str]:
    """The word and label columns, checked in every split (a test split may have no labels)."""
    columns = reference_split(raw).column_names
    text_column = pick_column(data_args.text_column_name, "tokens", 0, columns, "text_column_name")
    label_column = pick_column(
        data_args.label_column_name, f"{data_args.task_name}_tags", 1, columns, "label_column_name"
    )
    for split_name, split in raw.items():
        needed = (text_column,) if split_name == "test" else (text_column, label_column)
        missing = [c for c in needed if c not in split.column_names]
        if missing:
            raise ValueError(
                f"the {split_name} data has no column {', '.join(missing)} (columns: {', '.join(split.column_names)})"
                "; set --text_column_name / --label_column_name"
            )
    return text_column, label_column


def reference_split(raw: dict[str, datasets.Dataset]) -> datasets.Dataset:
    return raw["train"] if "train" in raw else raw.get("validation", next(iter(raw.values())))


def collect_labels(raw: dict[str, datasets.Dataset], label_column: str) -> tuple[list, dict, bool]:
    """ClassLabel sequences carry their names; otherwise the labels are the strings found in the data, sorted."""
    label_feature = getattr(reference_split(raw).features[label_column], "feature", None)
    if isinstance(label_feature, datasets.ClassLabel):
        label_list = list(label_feature.names)
        return label_list, {i: i for i in range(len(label_list))}, True
    found = set()
    for split in raw.values():
        if label_column in split.column_names:
            found.update(label for labels in split[label_column] for label in labels)
    label_list = sorted(found, key=str)
    return label_list, {label: i for i, label in enumerate(label_list)}, False


def load_model_and_tokenizer(
    model_args: ModelArguments, num_labels: int, training_args: IPUTrainingArguments
) -> tuple[Any, Any, Any]:
    """The token classifier, its fast tokenizer (word ids) and its config."""
    hub = model_args.hub_kwargs()
    config = AutoConfig.from_pretrained(
        model_args.config_name or model_args.model_name_or_path, num_labels=num_labels, **hub
    )
    # Byte-level BPE tokenizers need a space before each pre-split word to tokenize it as inside a sentence.
    tokenizer_kwargs = {"add_prefix_space": True} if config.model_type in ("gpt2", "roberta", "deberta") else {}
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=True, **tokenizer_kwargs, **hub
    )
    if not tokenizer.is_fast:
        raise ValueError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; this script needs word ids. Use a model with a "
            "tokenizer.json (the `tokenizers` library), see https://huggingface.co/transformers/index.html"
        )
    if tokenizer.pad_token is None:  # GPT-2: pad with end-of-text
        tokenizer.pad_token = tokenizer.eos_token
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    model = example_utils.load_pretrained(
        AutoModelForTokenClassification,
        model_args.model_name_or_path,
        training_args,
        config=config,
        ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
        **hub,
    )
    return model, tokenizer, config


def align_model_labels(model: Any, label_list: list, label_to_id: dict, labels_are_int: bool) -> tuple[list, dict]:
    """A model fine-tuned with the same label names keeps its ids; any other mapping is replaced by the data's."""
    model_label2id = {str(k): int(v) for k, v in model.config.label2id.items()}
    if model_label2id != PretrainedConfig(num_labels=len(label_list)).label2id:
        if sorted(model_label2id) == sorted(str(label) for label in label_list):
            if labels_are_int:
                label_to_id = {i: model_label2id[str(label)] for i, label in enumerate(label_list)}
            label_list = [name for name, _ in sorted(model_label2id.items(), key=lambda kv: kv[1])]
            if not labels_are_int:
                label_to_id = {label: i for i, label in enumerate(label_list)}
        else:
            logger.warning("the model's labels %s do not match the data's: using the data's", model_label2id)
    model.config.label2id = {str(label): i for i, label in enumerate(label_list)}
    model.config.id2label = {i: str(label) for i, label in enumerate(label_list)}
    return label_list, label_to_id


def aligner(
    tokenizer: Any,
    columns: tuple[str, str],
    label_to_id: dict,
    label_names: list[str],
    max_seq_length: int,
    data_args: Any,
) -> Callable[[dict[str, list]], dict[str, list]]:
    """Tokenizes word lists and gives each word's first token its label (the others -100, or I-X with
    `--label_all_tokens`)."""
    text_column, label_column = columns
    padding = "max_length" if data_args.pad_to_max_length else False
    # With --label_all_tokens, the tokens after the first of a B-X word get I-X (when the data has I-X).
    b_to_i_label = [
        label_names.index("I-" + name[2:]) if name.startswith("B-") and "I-" + name[2:] in label_names else index
        for index, name in enumerate(label_names)
    ]

    def tokenize_and_align_labels(examples: dict[str, list]) -> dict[str, list]:
        tokenized = tokenizer(
            examples[text_column], padding=padding, truncation=True, max_length=max_seq_length, is_split_into_words=True
        )
        if label_column not in examples:
            return tokenized
        all_labels = []
        for i, word_labels in enumerate(examples[label_column]):
            previous, label_ids = None, []
            for word in tokenized.word_ids(batch_index=i):
                if word is None:
                    label_ids.append(IGNORE_INDEX)
                elif word != previous:
                    label_ids.append(label_to_id[word_labels[word]])
                else:
                    label = label_to_id[word_labels[word]]
                    label_ids.append(b_to_i_label[label] if data_args.label_all_tokens else IGNORE_INDEX)
                previous = word
            all_labels.append(label_ids)
        tokenized["labels"] = all_labels
        return tokenized

    return tokenize_and_align_labels


def write_predictions(
    trainer: IPUTrainer, tokenizer: Any, examples: datasets.Dataset, text_column: str, logits: Any, label_names: list
) -> None:
    """`predictions.txt`: one line of labels per example, the prediction of each word's first token."""
    if not trainer.is_world_process_zero():
        return
    path = os.path.join(trainer.args.output_dir, "predictions.txt")
    encoded = tokenizer(
        list(examples[text_column]), is_split_into_words=True, truncation=True, max_length=logits.shape[1]
    )
    with open(path, "w", encoding="utf-8") as writer:
        for i, row in enumerate(np.argmax(logits, axis=2)):
            word_ids = encoded.word_ids(batch_index=i)
            firsts = [t for t, w in enumerate(word_ids) if w is not None and (t == 0 or word_ids[t - 1] != w)]
            writer.write(" ".join(label_names[row[t]] for t in firsts) + "\n")
    logger.info("Predictions written to %s", path)


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)
    columns = resolve_columns(raw, data_args)
    label_list, label_to_id, labels_are_int = collect_labels(raw, columns[1])
    model, tokenizer, config = load_model_and_tokenizer(model_args, len(label_list), training_args)
    label_list, label_to_id = align_model_labels(model, label_list, label_to_id, labels_are_int)
    label_names = [str(label) for label in label_list]
    longest = example_utils.max_model_length(tokenizer, config)
    max_seq_length = min(data_args.max_seq_length or longest, longest)
    if data_args.max_seq_length is not None and data_args.max_seq_length > longest:
        logger.warning("max_seq_length %d > the model's %d: using the latter", data_args.max_seq_length, longest)
    preprocess = aligner(tokenizer, columns, label_to_id, label_names, max_seq_length, data_args)

    def tokenized(split: str, limit: int | None, flag: str) -> datasets.Dataset:
        return example_utils.tokenize_split(raw, split, preprocess, training_args, data_args, limit, flag)

    train_dataset = tokenized("train", data_args.max_train_samples, "--do_train") if training_args.do_train else None
    eval_dataset = tokenized("validation", data_args.max_eval_samples, "--do_eval") if training_args.do_eval else None
    # tokenized before training: a missing test split is reported before any time is spent
    predict_dataset = (
        tokenized("test", data_args.max_predict_samples, "--do_predict") if training_args.do_predict else None
    )
    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)
    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=seqeval_metrics(label_names, data_args.return_entity_level_metrics),
    )
    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(train_dataset)):
            return
    if training_args.do_eval:
        example_utils.evaluate(trainer, len(eval_dataset))
    if training_args.do_predict:
        logger.info("*** Predict ***")
        output = trainer.predict(predict_dataset, metric_key_prefix="predict")
        if "labels" in predict_dataset.column_names:
            output.metrics["predict_samples"] = len(predict_dataset)
            trainer.log_metrics("predict", output.metrics)
            trainer.save_metrics("predict", output.metrics)
        logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
        examples = raw["test"].select(range(len(predict_dataset)))
        write_predictions(trainer, tokenizer, examples, columns[0], logits, label_names)
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
