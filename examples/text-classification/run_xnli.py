#!/usr/bin/env python
"""Fine-tune a multilingual sequence classifier on XNLI (premise, hypothesis -> entailment / neutral /
contradiction) with `IPUTrainer`: the recipe of Optimum Graphcore's `run_xnli.py`, run from this folder (it reads
`./ipu_config.json` unless `--ipu_config_name` says otherwise):

    python run_xnli.py --model_name_or_path bert-base-multilingual-cased --ipu_config_name Graphcore/bert-base-ipu \\
      --language de --train_language en --do_train --do_eval --per_device_train_batch_size 32 \\
      --learning_rate 5e-5 --num_train_epochs 2.0 --max_seq_length 128 --output_dir ./output/xnli/

The data is the Hub's `xnli` (one configuration per language) unless `--dataset_name` names another dataset of the
same layout (a Hub id or a local dataset folder with a configuration per language): the training split in
`--train_language` (default: `--language`), the validation and test splits in `--language`. Without a network give
local files in XNLI's layout instead: `--train_file` / `--validation_file` / `--test_file` (CSV or JSON lines) with
the columns `premise`, `hypothesis` and `label` (XNLI's class ids 0, 1, 2 or the names `entailment`, `neutral`,
`contradiction`); a file with a `language` column keeps the rows of `--train_language` (training) and `--language`
(evaluation, prediction). The metric is accuracy (`eval_accuracy`, as the `xnli` metric of `evaluate`). Writes
`train_results.json`, `eval_results.json`, `all_results.json`, with `--do_predict` `predict_results.json` and
`predictions.txt` (`index\\tprediction`, label names), and after training `training_curves.png`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
import torch
from torchmetrics.functional import accuracy
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    default_data_collator,
    set_seed,
)

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script

logger = logging.getLogger(__name__)
SPLITS = example_utils.SPLIT_FLAGS  # the flag that asks for each split

# XNLI's label names, in the order of its ClassLabel (`facebook/xnli`)
XNLI_LABELS = ["entailment", "neutral", "contradiction"]
TEXT_COLUMNS = ("premise", "hypothesis")
FILE_FORMATS = ("csv", "json", "jsonl")


@dataclass
class ModelArguments(example_utils.ModelArguments):
    """Which model, config and tokenizer to fine-tune, and the languages to train and evaluate in."""

    language: str | None = field(
        default=None,
        metadata={"help": "Evaluation language (en, de, fr, ...); the training one too, unless --train_language."},
    )
    train_language: str | None = field(
        default=None, metadata={"help": "Training language, if not --language (e.g. train in en, evaluate in de)."}
    )
    do_lower_case: bool = field(default=False, metadata={"help": "Lower-case the text in the tokenizer."})
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a model whose classification head has another number of labels."}
    )


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize it."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Dataset of XNLI's layout (default: the Hub's xnli): a Hub id or a local dataset folder."},
    )
    train_file: str | None = field(default=None, metadata={"help": "Training data: CSV or JSON lines, XNLI's columns."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same layout."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data, same layout."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per example after truncation and padding."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every example to max_seq_length (static shapes, one compiled graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep this many prediction examples."})

    def __post_init__(self) -> None:
        example_utils.check_at_least_one(self)
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and path.rsplit(".", 1)[-1].lower() not in FILE_FORMATS:
                raise ValueError(
                    f"--{name} {path}: expected a CSV or JSON (lines) file with premise, hypothesis, label"
                )

    def local_files(self) -> dict[str, str | None]:
        return {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}


def split_language(split: str, model_args: ModelArguments) -> str | None:
    """The language a split is read in: training in --train_language (default --language), the others in --language."""
    return (model_args.train_language or model_args.language) if split == "train" else model_args.language


def load_raw_datasets(
    data_args: DataTrainingArguments, model_args: ModelArguments, splits: list[str]
) -> dict[str, datasets.Dataset]:
    """The wanted splits, each in its language: from local files, or from `--dataset_name` (one configuration per
    language, as the Hub's `xnli`)."""
    if any(data_args.local_files().values()):
        files = {split: data_args.local_files()[split] for split in splits}
        for split, path in files.items():
            if path is None:
                raise ValueError(f"--{SPLITS[split]} needs --{split}_file (local files are given: give this one too)")
        raw = example_utils.load_data_files(files, model_args.cache_dir)
        return {split: keep_language(rows, split, model_args, files[split]) for split, rows in raw.items()}
    data_args.dataset_name = data_args.dataset_name or "xnli"
    raw = {}
    for split in splits:
        language = split_language(split, model_args)
        if language is None:
            raise ValueError(
                f"--language: give the XNLI language to evaluate in (en, de, fr, ...); --dataset_name "
                f"{data_args.dataset_name} has one configuration per language"
            )
        hint = "--train_file / --validation_file (CSV or JSON lines with premise, hypothesis, label)"
        raw[split] = example_utils.load_hub_dataset(
            data_args.dataset_name,
            language,
            local_files_hint=hint,
            split=split,
            cache_dir=model_args.cache_dir,
            token=model_args.token,
        )
    return raw


def keep_language(rows: datasets.Dataset, split: str, model_args: ModelArguments, path: str) -> datasets.Dataset:
    """A local file's rows in the split's language, when the file has a `language` column (all rows otherwise)."""
    language = split_language(split, model_args)
    if "language" not in rows.column_names or language is None:
        return rows
    kept = rows.filter(lambda row: row["language"] == language)
    if len(kept) == 0:
        found = ", ".join(sorted(set(rows["language"]))[:20])
        flag = "--train_language" if split == "train" and model_args.train_language else "--language"
        raise ValueError(
            f"{flag} {language}: --{split}_file {path} has no row of that language (its languages: {found})"
        )
    return kept


def label_encoder(raw: dict[str, datasets.Dataset]) -> Callable[[list], list[int]]:
    """Labels to XNLI's class ids: a ClassLabel column as it is; ids 0-2 or the names `entailment`, `neutral`,
    `contradiction` (a clear error for anything else)."""
    to_id = {name: i for i, name in enumerate(XNLI_LABELS)} | {i: i for i in range(3)} | {str(i): i for i in range(3)}
    for split, rows in raw.items():
        missing = [c for c in (*TEXT_COLUMNS, "label") if c not in rows.column_names]
        if missing and not (split == "test" and missing == ["label"]):
            raise ValueError(
                f"the {split} data has no column {', '.join(missing)} (columns: {', '.join(rows.column_names)}); "
                "XNLI's layout is premise, hypothesis, label"
            )
        feature = rows.features.get("label")
        if isinstance(feature, datasets.ClassLabel):
            if list(feature.names) != XNLI_LABELS:
                raise ValueError(f"the {split} data's labels are {feature.names}; XNLI's are {XNLI_LABELS}")
            continue
        if "label" in rows.column_names:
            unknown = [v for v in dict.fromkeys(rows["label"]) if v not in to_id]
            if unknown:
                raise ValueError(
                    f"the {split} data has label values {unknown[:5]}: XNLI's labels are the ids 0, 1, 2 or the "
                    f"names {', '.join(XNLI_LABELS)}"
                )

    def encode(labels: list) -> list[int]:
        return [to_id[v] for v in labels]

    return encode


def load_model_and_tokenizer(model_args: ModelArguments, training_args: IPUTrainingArguments) -> tuple[Any, Any]:
    """The classifier with XNLI's three labels, and its tokenizer (decoders pad with end-of-text)."""
    hub = model_args.hub_kwargs()
    config = AutoConfig.from_pretrained(
        model_args.config_name or model_args.model_name_or_path,
        num_labels=len(XNLI_LABELS),
        id2label=dict(enumerate(XNLI_LABELS)),
        label2id={name: i for i, name in enumerate(XNLI_LABELS)},
        **hub,
    )
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path,
        do_lower_case=model_args.do_lower_case,
        use_fast=model_args.use_fast_tokenizer,
        **hub,
    )
    if tokenizer.pad_token is None:  # GPT-2 and other decoders, as Optimum Graphcore's script did
        if tokenizer.eos_token is None:
            raise ValueError(f"{model_args.model_name_or_path}: the tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    model = example_utils.load_pretrained(
        AutoModelForSequenceClassification,
        model_args.model_name_or_path,
        training_args,
        config=config,
        ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
        **hub,
    )
    return model, tokenizer


def tokenized_splits(
    raw: dict[str, datasets.Dataset],
    tokenizer: Any,
    encode: Callable[[list], list[int]],
    data_args: DataTrainingArguments,
    training_args: IPUTrainingArguments,
) -> dict[str, datasets.Dataset]:
    """Each split tokenized as premise / hypothesis pairs, with `labels`; the first --max_*_samples kept."""
    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)

    def preprocess(examples: dict[str, list]) -> dict[str, list]:
        padding = "max_length" if data_args.pad_to_max_length else False
        result = tokenizer(
            examples["premise"], examples["hypothesis"], padding=padding, max_length=max_seq_length, truncation=True
        )
        if "label" in examples:
            result["labels"] = encode(examples["label"])
        return result

    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
    limits["test"] = data_args.max_predict_samples
    out = {}
    for split, rows in raw.items():
        if len(rows) == 0:
            raise ValueError(f"--{SPLITS[split]}: the {split} data is empty; give data with rows")
        out[split] = example_utils.tokenize_split(
            raw, split, preprocess, training_args, data_args, limits[split], f"--{SPLITS[split]}"
        )
    if "train" in out:
        for index in random.sample(range(len(out["train"])), min(3, len(out["train"]))):
            logger.info("Sample %d of the training set: %s.", index, out["train"][index])
    return out


def compute_metrics(p: EvalPrediction) -> dict[str, float]:
    """Accuracy, the key of the `xnli` metric of `evaluate`, computed by torchmetrics."""
    logits = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
    preds = torch.as_tensor(np.argmax(logits, axis=-1))
    labels = torch.as_tensor(np.asarray(p.label_ids)).long()
    return {"accuracy": float(accuracy(preds, labels, task="multiclass", num_classes=len(XNLI_LABELS)))}


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args, example_utils.requested_splits(training_args))
    encode = label_encoder(raw)
    model, tokenizer = load_model_and_tokenizer(model_args, training_args)
    splits = tokenized_splits(raw, tokenizer, encode, data_args, training_args)
    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)
    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=splits.get("train"),
        eval_dataset=splits.get("validation"),
        compute_metrics=compute_metrics,
        processing_class=tokenizer,
        data_collator=collator,
    )
    if training_args.do_train and not example_utils.train(
        trainer, training_args, last_checkpoint, len(splits["train"])
    ):
        return
    if training_args.do_eval:
        example_utils.evaluate(trainer, len(splits["validation"]))
    if training_args.do_predict:
        example_utils.write_class_predictions(trainer, splits["test"], XNLI_LABELS.__getitem__)
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
