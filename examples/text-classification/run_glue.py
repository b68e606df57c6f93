#!/usr/bin/env python
"""Fine-tune a `transformers` model for sequence classification (GLUE, or your own CSV/JSON/TSV) with `IPUTrainer`.

The recipe of Optimum Graphcore's `run_glue.py`, run from this folder (it reads `./ipu_config.json`):

    python run_glue.py --ipu_config_name=./ --model_name_or_path bert-base-cased --task_name sst2 \\
      --do_train --do_eval --max_seq_length 128 --per_device_train_batch_size 8 --learning_rate 2e-5 \\
      --num_train_epochs 3 --output_dir ./output/sst2/

`--task_name` alone downloads the Hub's `nyu-mll/glue` once (then reads the local datasets cache); `--dataset_name`
takes any Hub dataset or local dataset folder. Without a network, give local files instead: `--train_file` /
`--validation_file` / `--test_file` take CSV, JSON (lines) or the GLUE TSV files (`SST-2/train.tsv`, `MRPC/dev.tsv`,
...; their columns are renamed to the Hub's: `#1 String` -> `sentence1`, `Quality` -> `label`, ...). With `--task_name`,
the task decides the text columns, the label names and the metric (`nyu-mll/glue`'s); without it, the first one
or two non-label columns are the text and the metric is accuracy (mse for float labels).
`--packing` packs several training examples into each `max_seq_length` row (attention kept inside each example,
positions restarted; evaluation unpacked) and adds `train_features` / `train_features_per_second` to the train
metrics. Writes `train_results.json`, `eval_results.json` and `all_results.json` (`eval_accuracy`, `eval_f1`, ...)
and, after training, `training_curves.png`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import csv
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import datasets
import numpy as np
import pandas as pd
import torch
import transformers
from example_utils.peft import PeftArguments, maybe_wrap_with_lora
from torchmetrics.functional import (
    accuracy,
    f1_score,
    matthews_corrcoef,
    mean_squared_error,
    pearson_corrcoef,
    spearman_corrcoef,
)
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    PretrainedConfig,
    default_data_collator,
    set_seed,
)

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.packing import PackedSequenceClassificationLoss, prepare_packed_training

logger = logging.getLogger(__name__)

# The text columns of each GLUE task, as `nyu-mll/glue` names them.
TASK_TO_KEYS: dict[str, tuple[str, str | None]] = {
    "cola": ("sentence", None),
    "mnli": ("premise", "hypothesis"),
    "mrpc": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "qqp": ("question1", "question2"),
    "rte": ("sentence1", "sentence2"),
    "sst2": ("sentence", None),
    "stsb": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
# The label names of each task (`nyu-mll/glue`'s ClassLabel); STS-B is a regression.
TASK_LABELS: dict[str, list[str]] = {
    "cola": ["unacceptable", "acceptable"],
    "mnli": ["entailment", "neutral", "contradiction"],
    "mrpc": ["not_equivalent", "equivalent"],
    "qnli": ["entailment", "not_entailment"],
    "qqp": ["not_duplicate", "duplicate"],
    "rte": ["entailment", "not_entailment"],
    "sst2": ["negative", "positive"],
    "stsb": [],
    "wnli": ["not_entailment", "entailment"],
}
# Columns of the original GLUE TSV files, renamed to the Hub's names.
TSV_RENAMES = {
    "Quality": "label",
    "#1 String": "sentence1",
    "#2 String": "sentence2",
    "is_duplicate": "label",
    "gold_label": "label",
    "score": "label",
}
MNLI_TSV_RENAMES = {"sentence1": "premise", "sentence2": "hypothesis"}
COLA_TSV_COLUMNS = ["source", "label", "original_label", "sentence"]  # CoLA's train/dev TSVs have no header
FILE_FORMATS = ("csv", "json", "jsonl", "tsv")


@dataclass
class ModelArguments(example_utils.ModelArguments):
    """Which model, config and tokenizer to fine-tune."""

    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a model whose classification head has another number of labels."}
    )


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize it."""

    task_name: str | None = field(default=None, metadata={"help": f"GLUE task: {', '.join(TASK_TO_KEYS)}."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hub, or a local dataset folder."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per example after truncation and padding."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every example to max_seq_length (static shapes, one compiled graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep this many prediction examples."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: CSV, JSON(L) or GLUE TSV."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same formats."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data, same formats."})
    packing: bool = field(
        default=False,
        metadata={"help": "Pack several training examples into each max_seq_length row (attention kept per example)."},
    )
    max_sequences_per_pack: int | None = field(default=None, metadata={"help": "At most this many examples a row."})

    def __post_init__(self) -> None:
        example_utils.check_at_least_one(self)
        if self.max_sequences_per_pack is not None:
            if not self.packing:
                raise ValueError(
                    f"--max_sequences_per_pack {self.max_sequences_per_pack} is given without --packing; add "
                    "--packing or leave it out"
                )
            if self.max_sequences_per_pack < 1:
                raise ValueError(
                    f"--max_sequences_per_pack {self.max_sequences_per_pack}: expected a positive number of "
                    "examples a row (or leave it out: no limit)"
                )
        if self.task_name is not None:
            self.task_name = self.task_name.lower()
            if self.task_name not in TASK_TO_KEYS:
                raise ValueError(
                    f"--task_name {self.task_name}: unknown GLUE task; pick one of {', '.join(TASK_TO_KEYS)} "
                    "(or leave it out to classify your own CSV/JSON data, with accuracy as the metric)"
                )
        elif self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("give --task_name, --dataset_name or --train_file/--validation_file (CSV, JSON or TSV)")
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and file_format(path) not in FILE_FORMATS:
                raise ValueError(f"--{name} {path}: expected a {', '.join(FILE_FORMATS)} file")


def file_format(path: str) -> str:
    return path.rsplit(".", 1)[-1].lower()


def read_glue_tsv(path: str, task: str | None) -> datasets.Dataset:
    """A GLUE TSV file with the Hub's column names. No quoting (`quoting=3`): GLUE sentences contain bare
    quotes; `utf-8-sig` drops the byte-order mark MRPC's files start with; nothing is read as NaN."""
    read = {"sep": "\t", "quoting": csv.QUOTE_NONE, "encoding": "utf-8-sig", "keep_default_na": False}
    try:
        _check_tsv_fields(path)
        frame = pd.read_csv(path, **read)
        if task == "cola" and "sentence" not in frame.columns:
            frame = pd.read_csv(path, header=None, names=COLA_TSV_COLUMNS, **read)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:  # name the file
        raise ValueError(f"{path}: not a readable GLUE TSV file ({' '.join(str(err).split())[:200]})") from None
    frame = frame.rename(columns={k: v for k, v in TSV_RENAMES.items() if k in frame.columns})
    if task == "mnli":
        frame = frame.rename(columns=MNLI_TSV_RENAMES)
    return datasets.Dataset.from_pandas(frame, preserve_index=False)


def _check_tsv_fields(path: str) -> None:
    """Every line has the first line's number of fields: pandas takes a row with more as an index, silently."""
    with open(path, encoding="utf-8-sig") as f:
        widths = [(number, line.count("\t")) for number, line in enumerate(f, 1) if line.strip()]
    for number, tabs in widths[1:]:
        if tabs != widths[0][1]:
            fields = f"{tabs + 1} tab-separated fields, line 1 has {widths[0][1] + 1}"
            raise ValueError(f"{path}: line {number} has {fields}")


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation(_matched/_mismatched) / test splits, from local files or the Hugging Face Hub (or
    its local cache)."""
    files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}
    if any(files.values()):
        raw = {}
        for split, path in files.items():
            if path is None:
                continue
            if not os.path.isfile(path):
                raise FileNotFoundError(f"--{split}_file {path}: no such file")
            fmt = file_format(path)
            if fmt == "tsv":
                raw[split] = read_glue_tsv(path, data.task_name)
            else:
                builder = "json" if fmt in ("json", "jsonl") else "csv"
                raw[split] = datasets.load_dataset(builder, data_files={split: path}, cache_dir=model.cache_dir)[split]
        return raw
    name, config = data.dataset_name, data.dataset_config_name
    if name is None:  # --task_name alone: the Hub's GLUE
        name, config = "nyu-mll/glue", data.task_name
    hint = "--task_name sst2 --train_file SST-2/train.tsv --validation_file SST-2/dev.tsv (GLUE's own TSV files)"
    raw = example_utils.load_hub_dataset(
        name, config, local_files_hint=hint, cache_dir=model.cache_dir, token=model.token
    )
    return dict(raw)


def check_labels(raw: dict[str, datasets.Dataset], data: DataTrainingArguments) -> None:
    """Training and evaluation rows need a usable label: a missing one read as `""` became a class of its own, and
    GLUE's `-1` (its unlabelled test rows) or a NaN failed deep inside the loss."""
    for split, rows in raw.items():
        if split.startswith("test") or "label" not in rows.column_names:
            continue
        for row, value in enumerate(rows["label"]):
            if value is None or value == "" or value != value or (data.task_name and value in (-1, "-1")):
                path = getattr(data, f"{split.split('_')[0]}_file", None)
                where = f"--{split.split('_')[0]}_file {path}" if path else f"the {split} split"
                raise ValueError(
                    f"{where}, data row {row + 1}: label {value!r} is missing or unusable (-1 marks GLUE's "
                    "unlabelled test rows); give every training and evaluation row a label, or remove the row"
                )


def first_split(raw: dict[str, datasets.Dataset], *names: str) -> datasets.Dataset | None:
    return next((raw[name] for name in names if name in raw), None)


def resolve_labels(
    raw: dict[str, datasets.Dataset], task: str | None
) -> tuple[bool, list[str] | list[int] | None, dict | None]:
    """`(is_regression, label_list, label_to_id)`: what the label column holds and how it becomes class ids.

    `label_to_id` is None when the column needs no mapping (a ClassLabel, or a regression); with a GLUE task it
    takes the class ids as they are and the task's label names to their ids.
    """
    reference = first_split(raw, "train", "validation", "validation_matched")
    if reference is None:
        return task == "stsb", TASK_LABELS.get(task or "") or None, None
    if "label" not in reference.column_names:
        raise ValueError(
            f"the data has no 'label' column (columns: {', '.join(reference.column_names)}); name the label "
            "column 'label' in your CSV/JSON file"
        )
    feature = reference.features["label"]
    if isinstance(feature, datasets.ClassLabel):
        return False, list(feature.names), None
    is_regression = task == "stsb" or (task is None and feature.dtype in ("float32", "float64"))
    if is_regression:
        return True, None, None
    found = {v for split in raw.values() if "label" in split.column_names for v in split.unique("label")}
    try:
        values = sorted(found)
    except TypeError:  # mixed types: a stable order all the same
        values = sorted(found, key=str)
    if task is None:  # labels as found, sorted (transformers' run_glue does the same)
        return False, values, {v: i for i, v in enumerate(values)}
    names = TASK_LABELS[task]
    # Class ids as they are, label names to their ids; -1 marks GLUE's unlabelled test rows.
    label_to_id = {name: i for i, name in enumerate(names)} | {i: i for i in range(len(names))} | {-1: -1}
    label_to_id |= {str(i): i for i in range(len(names))}
    unknown = [v for v in values if v not in label_to_id]
    if unknown:
        raise ValueError(
            f"--task_name {task}: label values {unknown[:5]} are neither class ids 0..{len(names) - 1} nor the "
            f"task's label names {names}"
        )
    return False, names, label_to_id


def glue_metrics(task: str | None, is_regression: bool, num_labels: int) -> Callable[[EvalPrediction], dict]:
    """`compute_metrics` with the keys of `nyu-mll/glue`'s metric (`accuracy`, `f1`, `matthews_correlation`,
    `pearson`, `spearmanr`; `mse` for other regressions), computed by torchmetrics."""

    def compute(p: EvalPrediction) -> dict[str, float]:
        logits = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        labels = torch.as_tensor(np.asarray(p.label_ids))
        if is_regression:
            preds = torch.as_tensor(np.asarray(logits, dtype=np.float64)).reshape(-1)
            labels = labels.to(preds.dtype)
            if task == "stsb":
                result = {"pearson": pearson_corrcoef(preds, labels), "spearmanr": spearman_corrcoef(preds, labels)}
            else:
                result = {"mse": mean_squared_error(preds, labels)}
        else:
            preds = torch.as_tensor(np.argmax(logits, axis=-1))
            labels = labels.long()
            if task == "cola":
                result = {"matthews_correlation": matthews_corrcoef(preds, labels, task="binary")}
            else:
                classes = max(num_labels, 2)
                result = {"accuracy": accuracy(preds, labels, task="multiclass", num_classes=classes, average="micro")}
                if task in ("mrpc", "qqp"):
                    result["f1"] = f1_score(preds, labels, task="binary")
        result = {k: float(v) for k, v in result.items()}
        if len(result) > 1:
            result["combined_score"] = float(np.mean(list(result.values())))
        return result

    return compute


def packed_training(
    train_dataset: datasets.Dataset,
    model: transformers.PreTrainedModel,
    pad_token_id: int,
    max_seq_length: int,
    max_sequences_per_pack: int | None,
    collator: Callable[[list[dict]], dict],
) -> tuple[datasets.Dataset, Callable[[list[dict]], dict], PackedSequenceClassificationLoss]:
    """`--packing`: the training examples (tokenized without padding) packed into rows of `max_seq_length`
    tokens, a collator for those rows that hands unpacked evaluation / prediction examples to `collator`, and the
    packed loss (cross-entropy, or mean squared error when `num_labels == 1`)."""
    if model.config.problem_type == "multi_label_classification":
        raise ValueError(
            f"--packing: {model.config.problem_type=}, and this script reads one label a row (a class or a value); "
            "multi-label packing takes a multi-hot labels vector a feature (optimum_ipu.packing.prepare_packed_"
            "training with PackedSequenceClassificationLoss); use a single-label model here"
        )
    # the packed loss applies the model's head to each sequence's first token: it reads the hidden states;
    # evaluation batches (unpacked labels) get the model's own loss from it
    packing = prepare_packed_training(
        model,
        train_dataset,
        max_seq_length,
        pad_token_id,
        collator,
        PackedSequenceClassificationLoss(model),
        max_sequences_per_pack,
        output_hidden_states=True,
    )
    return packing.train_dataset, packing.data_collator, packing.compute_loss_func


def text_columns(raw: dict[str, datasets.Dataset], task: str | None) -> tuple[str, str | None]:
    """The one or two text columns: the task's, else `sentence1`/`sentence2` or the first non-label columns."""
    if task is not None:
        keys = TASK_TO_KEYS[task]
    else:
        names = [name for name in first_split(raw, "train", *raw).column_names if name != "label"]
        if "sentence1" in names and "sentence2" in names:
            keys = ("sentence1", "sentence2")
        else:
            keys = (names[0], names[1]) if len(names) >= 2 else (names[0], None)
    for split_name, split in raw.items():
        missing = [k for k in keys if k is not None and k not in split.column_names]
        if missing:
            wanted = ", ".join(k for k in keys if k)
            reader = f"--task_name {task} reads" if task else "the text columns (found in the training data) are"
            raise ValueError(
                f"the {split_name} data has no column {', '.join(missing)} (columns: {', '.join(split.column_names)})"
                f"; {reader} {wanted}"
            )
    return keys


def load_model_and_tokenizer(
    model_args: ModelArguments, num_labels: int, training_args: IPUTrainingArguments
) -> tuple[Any, Any]:
    """The classifier and its tokenizer; decoders without a padding token pad with end-of-text."""
    hub = model_args.hub_kwargs()
    config = AutoConfig.from_pretrained(
        model_args.config_name or model_args.model_name_or_path, num_labels=num_labels, **hub
    )
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer, **hub
    )
    # GPT-2 and other decoders have no padding token: pad with end-of-text, and tell the model which id it is
    # (its sequence classifier reads the last non-padding token).
    if tokenizer.pad_token is None:
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


def align_labels(model: Any, label_list: list, label_to_id: dict | None, num_labels: int) -> tuple[list, dict | None]:
    """A model fine-tuned with the same label names keeps its ids; any other mapping is replaced by the data's."""
    default_label2id = PretrainedConfig(num_labels=num_labels).label2id
    model_label2id = {str(k): int(v) for k, v in model.config.label2id.items()}
    names = [str(label) for label in label_list]
    if model_label2id != default_label2id and sorted(model_label2id) == sorted(names):
        remap = {i: model_label2id[name] for i, name in enumerate(names)}
        current = label_to_id if label_to_id is not None else {i: i for i in remap} | {-1: -1}
        label_to_id = {key: (remap[v] if v >= 0 else v) for key, v in current.items()}
        names = [name for name, _ in sorted(model_label2id.items(), key=lambda kv: kv[1])]
    elif model_label2id != default_label2id:
        logger.warning("the model's labels %s do not match the data's %s: using the data's", model_label2id, names)
    model.config.label2id = {name: i for i, name in enumerate(names)}
    model.config.id2label = dict(enumerate(names))
    return names, label_to_id


def preprocessor(tokenizer: Any, keys: tuple[str, str | None], max_seq_length: int, label_to_id: dict | None) -> Any:
    def preprocess(examples: dict[str, list], pad: bool) -> dict[str, list]:
        texts = (examples[keys[0]],) if keys[1] is None else (examples[keys[0]], examples[keys[1]])
        result = tokenizer(*texts, padding="max_length" if pad else False, max_length=max_seq_length, truncation=True)
        if "label" in examples:
            # Written as `labels` (the model's argument): a new column, so `map` cannot keep the old string type.
            labels = examples["label"]
            result["labels"] = [label_to_id[v] for v in labels] if label_to_id is not None else labels
        return result

    return preprocess


def tokenized_splits(raw: dict, preprocess: Any, task: str | None, data_args: Any, training_args: Any) -> dict:
    """The splits the run needs, tokenized; `validation_mismatched` too for MNLI."""

    def tokenized(split: str, limit: int | None, flag: str, pad: bool | None = None) -> datasets.Dataset:
        rows = len(raw[split]) if split in raw else None
        if rows is not None and min(rows, rows if limit is None else limit) <= 0:  # found before training, not after
            raise ValueError(f"{flag}: the {split} data is empty; give a file with rows (and a --max_*_samples >= 1)")
        pad = data_args.pad_to_max_length if pad is None else pad
        return example_utils.tokenize_split(
            raw, split, partial(preprocess, pad=pad), training_args, data_args, limit, flag
        )

    out = {}
    if training_args.do_train:
        # packed rows are built from unpadded examples; evaluation keeps --pad_to_max_length
        out["train"] = tokenized(
            "train", data_args.max_train_samples, "--do_train", False if data_args.packing else None
        )
        for index in random.sample(range(len(out["train"])), min(3, len(out["train"]))):
            logger.info("Sample %d of the training set: %s.", index, out["train"][index])
    mnli = task == "mnli"
    if training_args.do_eval:
        matched = "validation_matched" if mnli and "validation_matched" in raw else "validation"
        out["eval"] = tokenized(matched, data_args.max_eval_samples, "--do_eval")
        if mnli and "validation_mismatched" in raw:
            out["eval_mm"] = tokenized("validation_mismatched", data_args.max_eval_samples, "--do_eval")
    if training_args.do_predict:
        predict_split = "test_matched" if mnli and "test_matched" in raw else "test"
        out["predict"] = tokenized(predict_split, data_args.max_predict_samples, "--do_predict")
    return out


def evaluate(trainer: IPUTrainer, splits: dict) -> None:
    """`eval_*` metrics (and MNLI's mismatched `eval_*_mm`), logged and saved in `eval_results.json`."""
    logger.info("*** Evaluate ***")
    combined: dict[str, float] = {}
    for suffix, dataset in (("", splits["eval"]), ("_mm", splits.get("eval_mm"))):
        if dataset is None:
            continue
        metrics = {**trainer.evaluate(eval_dataset=dataset), "eval_samples": len(dataset)}
        metrics = {f"{key}{suffix}": value for key, value in metrics.items()}
        combined.update(metrics)
        trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", combined)


def write_predictions(
    trainer: IPUTrainer, dataset: datasets.Dataset, task: str | None, is_regression: bool, label_list: list
) -> None:
    """`predict_results[_TASK].txt`: index and predicted label (or value) of every test example."""
    logger.info("*** Predict ***")
    if "labels" in dataset.column_names:
        dataset = dataset.remove_columns("labels")
    predictions = trainer.predict(dataset).predictions
    predictions = predictions[0] if isinstance(predictions, tuple) else predictions
    predictions = np.squeeze(predictions) if is_regression else np.argmax(predictions, axis=-1)
    if not trainer.is_world_process_zero():
        return
    path = os.path.join(trainer.args.output_dir, f"predict_results_{task}.txt" if task else "predict_results.txt")
    with open(path, "w", encoding="utf-8") as writer:
        writer.write("index\tprediction\n")
        for index, item in enumerate(np.atleast_1d(predictions)):
            writer.write(f"{index}\t{item:3.3f}\n" if is_regression else f"{index}\t{label_list[item]}\n")
    logger.info("Predictions written to %s", path)


def main() -> None:
    model_args, data_args, training_args, peft_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments, PeftArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    # `--dataset_name glue --dataset_config_name mrpc` is a GLUE task too: same columns, labels and metric.
    if data_args.task_name is None and (data_args.dataset_name or "").split("/")[-1] == "glue":
        data_args.task_name = data_args.dataset_config_name
    task = data_args.task_name
    raw = load_raw_datasets(data_args, model_args)
    check_labels(raw, data_args)
    is_regression, label_list, label_to_id = resolve_labels(raw, task)
    num_labels = 1 if is_regression else len(label_list or [])
    if not is_regression and num_labels < 2:
        raise ValueError(f"the label column holds {num_labels} distinct value(s) {label_list}: nothing to classify")
    keys = text_columns(raw, task)
    model, tokenizer = load_model_and_tokenizer(model_args, num_labels, training_args)
    if not is_regression:
        label_list, label_to_id = align_labels(model, label_list, label_to_id, num_labels)
    model = maybe_wrap_with_lora(model, peft_args, "SEQ_CLS")  # --use_peft: the classifier head trains too
    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    if data_args.max_seq_length > tokenizer.model_max_length:
        logger.warning("max_seq_length %d > the model's %d: using the latter", data_args.max_seq_length, max_seq_length)
    preprocess = preprocessor(tokenizer, keys, max_seq_length, label_to_id)
    splits = tokenized_splits(raw, preprocess, task, data_args, training_args)

    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)
    train_dataset, trainer_kwargs = splits.get("train"), {}
    if data_args.packing and train_dataset is not None:
        train_dataset, collator, trainer_kwargs["compute_loss_func"] = packed_training(
            train_dataset, model, tokenizer.pad_token_id, max_seq_length, data_args.max_sequences_per_pack, collator
        )
        # one `labels` tensor of per-sequence slots, read by the packed loss (the model gets no labels)
        training_args.label_names = ["labels"]
    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=splits.get("eval"),
        compute_metrics=glue_metrics(task, is_regression, num_labels),
        processing_class=tokenizer,
        data_collator=collator,
        **trainer_kwargs,
    )
    if training_args.do_train:
        rows, examples = len(train_dataset), len(splits["train"])

        def per_example(metrics: dict[str, Any]) -> dict[str, Any]:
            # packed: samples are rows; examples per second is the figure comparable with unpacked runs
            per_second = round(metrics["train_samples_per_second"] * examples / rows, 3)
            return {"train_features": examples, "train_features_per_second": per_second}

        extra = per_example if data_args.packing else None
        if not example_utils.train(trainer, training_args, last_checkpoint, rows, extra):
            return
    if training_args.do_eval:
        evaluate(trainer, splits)
    if training_args.do_predict:
        write_predictions(trainer, splits["predict"], task, is_regression, label_list)
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
