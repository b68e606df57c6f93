#!/usr/bin/env python
"""Fine-tune a `transformers` model for sequence classification (GLUE, or your own CSV/JSON/TSV) with `IPUTrainer`.

The recipe of Optimum Graphcore's `run_glue.py`, run from this folder (it reads `./ipu_config.json`):

    python run_glue.py --ipu_config_name=./ --model_name_or_path bert-base-cased --task_name sst2 \\
      --do_train --do_eval --max_seq_length 128 --per_device_train_batch_size 8 --learning_rate 2e-5 \\
      --num_train_epochs 3 --output_dir ./output/sst2/

Offline, give local files instead of the Hub's `nyu-mll/glue`: `--train_file` / `--validation_file` /
`--test_file` take CSV, JSON (lines) or the GLUE TSV files (`SST-2/train.tsv`, `MRPC/dev.tsv`, ...; their
columns are renamed to the Hub's: `#1 String` -> `sentence1`, `Quality` -> `label`, ...). With `--task_name`,
the task decides the text columns, the label names and the metric (`nyu-mll/glue`'s); without it, the first one
or two non-label columns are the text and the metric is accuracy (mse for float labels).
`--packing` packs several training examples into each `max_seq_length` row (attention kept inside each example,
positions restarted; evaluation unpacked) and adds `train_features` / `train_features_per_second` to the train
metrics. Writes `train_results.json`, `eval_results.json` and `all_results.json` (`eval_accuracy`, `eval_f1`, ...).
"""

from __future__ import annotations

import csv
import logging
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import datasets
import numpy as np
import pandas as pd
import torch
import transformers
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
    HfArgumentParser,
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
class ModelArguments:
    """Which model, config and tokenizer to fine-tune."""

    model_name_or_path: str = field(metadata={"help": "Model folder or id in the local Hugging Face cache."})
    config_name: str | None = field(default=None, metadata={"help": "Config folder or id, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer folder or id, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloaded models are cached."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (`tokenizers`) tokenizer."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a model whose classification head has another number of labels."}
    )


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize it."""

    task_name: str | None = field(default=None, metadata={"help": f"GLUE task: {', '.join(TASK_TO_KEYS)}."})
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset name (from the local datasets cache)."})
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
        for flag in ("max_seq_length", "max_train_samples", "max_eval_samples", "max_predict_samples"):
            value = getattr(self, flag)
            if value is not None and value < 1:
                raise ValueError(f"--{flag} {value}: expected an integer >= 1")
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
    """The train / validation(_matched/_mismatched) / test splits, from local files or the local datasets cache."""
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
    try:
        return dict(datasets.load_dataset(name, config, cache_dir=model.cache_dir, token=model.token))
    except Exception as err:  # offline: DatasetNotFoundError, ConnectionError, OfflineModeIsEnabled, ...
        raise SystemExit(
            f"--dataset_name {name} ({config}): not in the local datasets cache and the Hub cannot be reached "
            f"({type(err).__name__}). Pass local files instead, e.g. --task_name sst2 --train_file "
            "../../../shared/data/glue/SST-2/train.tsv --validation_file ../../../shared/data/glue/SST-2/dev.tsv"
        ) from None


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
            f"--packing: {model.config.problem_type=} is not supported (the packed loss is cross-entropy over one "
            "class a sequence, or mean squared error for a regression); train without --packing"
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


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, IPUTrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    for lib_logger in (logger, logging.getLogger("optimum_ipu")):
        lib_logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.info("Training/evaluation parameters %s", training_args)

    # A non-empty output_dir is resumed from its last checkpoint, or refused without --overwrite_output_dir.
    last_checkpoint = training_args.checkpoint_in_output_dir()
    training_args.load_ipu_config()  # a bad config or override is refused now, before any data or model is loaded

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

    # Which columns are the text.
    reference = first_split(raw, "train", *raw)
    if task is not None:
        sentence1_key, sentence2_key = TASK_TO_KEYS[task]
    else:
        text_columns = [name for name in reference.column_names if name != "label"]
        if "sentence1" in text_columns and "sentence2" in text_columns:
            sentence1_key, sentence2_key = "sentence1", "sentence2"
        elif len(text_columns) >= 2:
            sentence1_key, sentence2_key = text_columns[:2]
        else:
            sentence1_key, sentence2_key = text_columns[0], None
    for split_name, split in raw.items():
        missing = [k for k in (sentence1_key, sentence2_key) if k is not None and k not in split.column_names]
        if missing:
            wanted = ", ".join(k for k in (sentence1_key, sentence2_key) if k)
            reader = f"--task_name {task} reads" if task else "the text columns (found in the training data) are"
            raise ValueError(
                f"the {split_name} data has no column {', '.join(missing)} (columns: {', '.join(split.column_names)})"
                f"; {reader} {wanted}"
            )

    hub = {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }
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
    model = AutoModelForSequenceClassification.from_pretrained(
        model_args.model_name_or_path, config=config, ignore_mismatched_sizes=model_args.ignore_mismatched_sizes, **hub
    )

    # A model fine-tuned with the same label names keeps its ids; any other mapping is replaced by the data's.
    if not is_regression:
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
        label_list = names

    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    if data_args.max_seq_length > tokenizer.model_max_length:
        logger.warning("max_seq_length %d > the model's %d: using the latter", data_args.max_seq_length, max_seq_length)

    def preprocess(examples: dict[str, list], pad: bool) -> dict[str, list]:
        texts = (
            (examples[sentence1_key],) if sentence2_key is None else (examples[sentence1_key], examples[sentence2_key])
        )
        padding = "max_length" if pad else False
        result = tokenizer(*texts, padding=padding, max_length=max_seq_length, truncation=True)
        if "label" in examples:
            # Written as `labels` (the model's argument): a new column, so `map` cannot keep the old string type.
            labels = examples["label"]
            result["labels"] = [label_to_id[v] for v in labels] if label_to_id is not None else labels
        return result

    def tokenized(split: str, limit: int | None, flag: str, pad: bool | None = None) -> datasets.Dataset:
        if split not in raw:
            raise ValueError(f"{flag} needs a {split} dataset: give --{split.split('_')[0]}_file")
        examples = raw[split]
        if limit is not None:
            examples = examples.select(range(min(limit, len(examples))))
        if len(examples) == 0:  # found before training, not after it and the save
            raise ValueError(f"{flag}: the {split} data is empty; give a file with rows (and a --max_*_samples >= 1)")
        with training_args.main_process_first(desc=f"tokenize {split}"):
            return examples.map(
                partial(preprocess, pad=data_args.pad_to_max_length if pad is None else pad),
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=examples.column_names,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Running tokenizer on {split}",
            )

    train_dataset = eval_dataset = predict_dataset = None
    if training_args.do_train:
        # packed rows are built from unpadded examples; evaluation keeps --pad_to_max_length
        pad = False if data_args.packing else None
        train_dataset = tokenized("train", data_args.max_train_samples, "--do_train", pad)
        for index in random.sample(range(len(train_dataset)), min(3, len(train_dataset))):
            logger.info("Sample %d of the training set: %s.", index, train_dataset[index])
    matched = "validation_matched" if task == "mnli" and "validation_matched" in raw else "validation"
    if training_args.do_eval:
        eval_dataset = tokenized(matched, data_args.max_eval_samples, "--do_eval")
    if training_args.do_predict:
        predict_split = "test_matched" if task == "mnli" and "test_matched" in raw else "test"
        predict_dataset = tokenized(predict_split, data_args.max_predict_samples, "--do_predict")

    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)
    trainer_kwargs = {}
    train_features = len(train_dataset) if train_dataset is not None else 0
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
        eval_dataset=eval_dataset,
        compute_metrics=glue_metrics(task, is_regression, num_labels),
        processing_class=tokenizer,
        data_collator=collator,
        **trainer_kwargs,
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        if training_args.compile_only:
            logger.info("--compile_only: graphs compiled and cached; nothing trained or saved")
            return
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        if data_args.packing:  # samples are packed rows; examples per second is the comparable figure
            metrics["train_features"] = train_features
            metrics["train_features_per_second"] = round(
                metrics["train_samples_per_second"] * train_features / len(train_dataset), 3
            )
        trainer.save_model()
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        evaluations = [(task, eval_dataset)]
        if task == "mnli" and "validation_mismatched" in raw:
            evaluations.append(("mnli-mm", tokenized("validation_mismatched", data_args.max_eval_samples, "--do_eval")))
        combined: dict[str, float] = {}
        for name, dataset in evaluations:
            metrics = trainer.evaluate(eval_dataset=dataset)
            metrics["eval_samples"] = len(dataset)
            if name == "mnli-mm":
                metrics = {f"{key}_mm": value for key, value in metrics.items()}
            combined.update(metrics)
            trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", combined)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        if "labels" in predict_dataset.column_names:
            predict_dataset = predict_dataset.remove_columns("labels")
        predictions = trainer.predict(predict_dataset).predictions
        predictions = predictions[0] if isinstance(predictions, tuple) else predictions
        predictions = np.squeeze(predictions) if is_regression else np.argmax(predictions, axis=-1)
        if trainer.is_world_process_zero():
            path = os.path.join(
                training_args.output_dir, f"predict_results_{task}.txt" if task else "predict_results.txt"
            )
            with open(path, "w", encoding="utf-8") as writer:
                writer.write("index\tprediction\n")
                for index, item in enumerate(np.atleast_1d(predictions)):
                    writer.write(f"{index}\t{item:3.3f}\n" if is_regression else f"{index}\t{label_list[item]}\n")
            logger.info("Predictions written to %s", path)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
