#!/usr/bin/env python
"""Fine-tune LXMERT for visual question answering (a question and an image's region features -> an answer class)
with `IPUTrainer`: the recipe of Optimum Graphcore's `run_vqa.py`, run from this folder (it reads
`./ipu_config.json` unless `--ipu_config_name` says otherwise):

    python run_vqa.py --model_name_or_path unc-nlp/lxmert-base-uncased --ipu_config_name Graphcore/lxmert-base-ipu \\
      --dataset_name Graphcore/gqa-lxmert --do_train --do_eval --max_seq_length 512 \\
      --per_device_train_batch_size 1 --num_train_epochs 4 --learning_rate 1e-5 --loss_scaling 16384 \\
      --output_dir /tmp/gqa/ --dataloader_drop_last --replace_qa_head --n_ipu 16

The data is a Hub dataset in the layout of `Graphcore/vqa-lxmert` and `Graphcore/gqa-lxmert` (`--dataset_name`,
`--dataset_config_name`), or local files in it: `--train_file` / `--validation_file` / `--test_file`, JSON (one
object with the rows under `"data"`, as Optimum Graphcore's script read it), JSON lines (`.jsonl`) or CSV. A row has
`question` (text), `features` (regions x `visual_feat_dim` floats: Faster R-CNN region features, 36 x 2048 for
LXMERT), `normalized_boxes` (regions x 4: each region's box in [0, 1]) and `label`: an answer class id (GQA), or a
soft label `{"ids": [...], "weights": [...]}` (VQA v2; `--soft_label` says so, and labels of that form are read so
anyway, as its last script did). With `Graphcore/gqa-lxmert`, `--do_eval` evaluates on its `test` split (its
validation split was in LXMERT's pretraining), as there.

The loss is that of Optimum Graphcore's LXMERT: cross-entropy over the answers for class ids (the stock model's),
binary cross-entropy with logits against the soft label's weights (a `compute_loss_func`: the stock model takes
class ids only). The metric is accuracy (`eval_accuracy`): of the top answer against the class id, or with soft
labels the mean weight of the top answer (VQA's score). `--replace_qa_head` gives the model a new answer layer, one
output per answer class of the data (the dataset's `ClassLabel`; local files: the config's `num_qa_labels`).
Writes `train_results.json`, `eval_results.json`, `all_results.json`, with `--do_predict` `predict_results.json`
and `predictions.txt` (`index\\tprediction`), and after training `training_curves.png`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics.functional import accuracy
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
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

INPUT_COLUMNS = ("question", "features", "normalized_boxes")
FILE_FORMATS = ("csv", "json", "jsonl")
# GQA's validation split was in LXMERT's pretraining data: Optimum Graphcore's script evaluated on its test split
EVAL_SPLIT = {"Graphcore/gqa-lxmert": "test"}
LAYOUT = "question, features, normalized_boxes, label"


@dataclass
class ModelArguments(example_utils.ModelArguments):
    """Which model, config and tokenizer to fine-tune, and whether to give it a new answer layer."""

    replace_qa_head: bool = field(
        default=False,
        metadata={"help": "A new answer layer, one output per answer class of the data (re-initialized)."},
    )
    use_auth_token: bool = field(
        default=False,
        metadata={"help": "Optimum Graphcore's flag: the token `hf auth login` stored is used anyway (see --token)."},
    )


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize the questions."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset of the VQA layout (Graphcore/vqa-lxmert, Graphcore/gqa-lxmert)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration, if it has several."})
    train_file: str | None = field(
        default=None, metadata={"help": "Training data: JSON ({'data': [rows]}), JSON lines or CSV; " + LAYOUT}
    )
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same layout."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data, same layout (label optional)."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_seq_length: int = field(default=512, metadata={"help": "Question tokens after truncation and padding."})
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every question to max_seq_length (static shapes, one compiled graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep this many prediction examples."})
    # Optimum Graphcore's script had these four from run_qa.py and used none of them: accepted, without effect
    version_2_with_negative: bool = field(default=False, metadata={"help": "Unused (Optimum Graphcore's leftover)."})
    null_score_diff_threshold: float = field(default=0.0, metadata={"help": "Unused (Optimum Graphcore's leftover)."})
    n_best_size: int = field(default=20, metadata={"help": "Unused (Optimum Graphcore's leftover)."})
    max_answer_length: int = field(default=30, metadata={"help": "Unused (Optimum Graphcore's leftover)."})
    soft_label: bool = field(
        default=False,
        metadata={"help": "Soft labels {'ids': [...], 'weights': [...]} (VQA v2): binary cross-entropy loss."},
    )

    def __post_init__(self) -> None:
        if self.dataset_name is None and not any(self.local_files().values()):
            raise ValueError(
                "no data: give --dataset_name (Graphcore/vqa-lxmert, Graphcore/gqa-lxmert) or --train_file / "
                f"--validation_file / --test_file ({LAYOUT})"
            )
        example_utils.check_at_least_one(self)
        for name, path in self.local_files().items():
            if path is not None and path.rsplit(".", 1)[-1].lower() not in FILE_FORMATS:
                raise ValueError(
                    f'--{name}_file {path}: expected a JSON ({{"data": [rows]}}), JSON lines (.jsonl) or CSV file'
                )

    def local_files(self) -> dict[str, str | None]:
        return {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}


def load_raw_datasets(
    data_args: DataTrainingArguments, model_args: ModelArguments, splits: list[str]
) -> tuple[dict[str, datasets.Dataset], dict[str, str]]:
    """The wanted splits, from local files or `--dataset_name`, with where each came from (for error messages:
    `--train_file train.json`, `--dataset_name Graphcore/vqa-lxmert (split train)`)."""
    if any(data_args.local_files().values()):
        files = {split: data_args.local_files()[split] for split in splits}
        for split, path in files.items():
            if path is None:
                raise ValueError(f"--{SPLITS[split]} needs --{split}_file (local files are given: give this one too)")
        example_utils.require_files(files)
        raw = {split: load_file(split, path, model_args.cache_dir) for split, path in files.items()}
        return raw, {split: f"--{split}_file {path}" for split, path in files.items()}
    raw, sources = {}, {}
    hint = f"--train_file / --validation_file (JSON {{'data': [rows]}}, JSON lines or CSV: {LAYOUT})"
    for split in splits:
        name = EVAL_SPLIT.get(data_args.dataset_name, split) if split == "validation" else split
        raw[split] = example_utils.load_hub_dataset(
            data_args.dataset_name,
            data_args.dataset_config_name,
            local_files_hint=hint,
            split=name,
            cache_dir=model_args.cache_dir,
            token=model_args.token,
        )
        sources[split] = f"--dataset_name {data_args.dataset_name} (split {name})"
    return raw, sources


def load_file(split: str, path: str, cache_dir: str | None) -> datasets.Dataset:
    """A local file's rows: `.json` as Optimum Graphcore's script read it (one object, the rows under `"data"`),
    `.jsonl` as JSON lines, `.csv` (lists written as JSON text) as CSV."""
    extension = path.rsplit(".", 1)[-1].lower()
    builder = {"jsonl": "json"}.get(extension, extension)
    field_kwarg = {"field": "data"} if extension == "json" else {}
    try:
        loaded = datasets.load_dataset(builder, data_files={split: path}, cache_dir=cache_dir, **field_kwarg)
    except datasets.exceptions.DatasetGenerationError:
        if extension != "json":
            raise
        raise ValueError(
            f'--{split}_file {path}: a .json file is one JSON object with its rows under "data" '
            f'({{"data": [{{"question": ..., "features": ..., ...}}]}}, as Optimum Graphcore\'s script read it); '
            "write it so, or name a JSON lines file .jsonl"
        ) from None
    rows = loaded[split]
    if extension == "csv":  # CSV holds text: the list columns were written as JSON
        rows = rows.map(lambda row: decode_csv_lists(row, split, path))
    return rows


def decode_csv_lists(row: dict[str, Any], split: str, path: str) -> dict[str, Any]:
    """A CSV row's `features`, `normalized_boxes` and soft `label` read from their JSON text."""
    out = {}
    for column in ("features", "normalized_boxes", "label"):
        value = row.get(column)
        if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
            try:
                out[column] = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"--{split}_file {path}: column {column} is not valid JSON ({err})") from None
    return out


def find_class_label(feature: Any) -> datasets.ClassLabel | None:
    """The `ClassLabel` inside a label column's feature (a class id, or the `ids` of a soft label), if any."""
    if isinstance(feature, datasets.ClassLabel):
        return feature
    if isinstance(feature, dict):
        return find_class_label(feature.get("ids"))
    inner = getattr(feature, "feature", None)
    return find_class_label(inner) if inner is not None else None


def is_soft_feature(feature: Any) -> bool:
    """Whether a label column holds soft labels (`{"ids": [...], "weights": [...]}`), from its feature type."""
    inner = getattr(feature, "feature", feature)
    return isinstance(feature, dict) or (isinstance(inner, dict) and "ids" in inner)


def check_layout(raw: Mapping[str, datasets.Dataset], sources: Mapping[str, str], soft_flag: bool) -> bool:
    """
    Every split has the VQA columns (the test split may lack `label`), and its labels are of one kind.

    Returns:
        `bool`: whether the labels are soft (`{"ids", "weights"}`): so in the data, or `--soft_label` for data
            without labels.

    Raises:
        `ValueError`: one line naming the split's source, the missing column or the label kind and the fix.
    """
    kinds = {}
    for split, rows in raw.items():
        if len(rows) == 0:
            raise ValueError(f"{sources[split]}: no rows; give data with rows")
        wanted = (*INPUT_COLUMNS, "label") if split != "test" else INPUT_COLUMNS
        missing = [column for column in wanted if column not in rows.column_names]
        if missing:
            raise ValueError(
                f"{sources[split]}: no column {', '.join(missing)} (columns: {', '.join(rows.column_names)}); "
                f"the VQA layout is {LAYOUT}"
            )
        if "label" in rows.column_names:
            kinds[split] = is_soft_feature(rows.features["label"])
    if len(set(kinds.values())) > 1:
        said = ", ".join(f"{sources[s]}: {'soft' if soft else 'class ids'}" for s, soft in kinds.items())
        raise ValueError(f"the splits' labels are of two kinds ({said}); give every split the same kind")
    soft = next(iter(kinds.values()), soft_flag)
    if soft_flag and not soft:
        split = next(iter(kinds))
        raise ValueError(
            f"--soft_label: {sources[split]} has class ids as labels, not {{'ids': [...], 'weights': [...]}}; "
            "leave --soft_label out for class ids"
        )
    return soft


def answer_classes(raw: Mapping[str, datasets.Dataset]) -> datasets.ClassLabel | None:
    """The answer classes the data names (its label `ClassLabel`, as the Hub's VQA and GQA datasets have)."""
    for rows in raw.values():
        if "label" in rows.column_names:
            found = find_class_label(rows.features["label"])
            if found is not None:
                return found
    return None


def load_model_and_tokenizer(
    model_args: ModelArguments, training_args: IPUTrainingArguments, classes: datasets.ClassLabel | None
) -> tuple[Any, Any, int]:
    """LXMERT for question answering, its tokenizer, and the number of answers its head gives: the data's classes
    with `--replace_qa_head` (a new last answer layer), else the config's `num_qa_labels`."""
    hub = model_args.hub_kwargs()
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub)
    if not hasattr(config, "num_qa_labels") or not hasattr(config, "visual_feat_dim"):
        raise ValueError(
            f"--model_name_or_path {model_args.model_name_or_path}: a {config.model_type} model; visual question "
            "answering here takes LXMERT (e.g. unc-nlp/lxmert-base-uncased)"
        )
    num_labels = classes.num_classes if classes is not None and model_args.replace_qa_head else config.num_qa_labels
    if classes is not None and classes.num_classes != num_labels:
        raise ValueError(
            f"the data has {classes.num_classes} answer classes and the model's answer head {num_labels} "
            "(num_qa_labels); pass --replace_qa_head for a new answer layer of the data's classes"
        )
    replace = model_args.replace_qa_head and num_labels != config.num_qa_labels
    config.num_qa_labels = num_labels
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer, **hub
    )
    model = example_utils.load_pretrained(
        AutoModelForQuestionAnswering,
        model_args.model_name_or_path,
        training_args,
        config=config,
        ignore_mismatched_sizes=replace,  # the new answer layer's shape differs from the checkpoint's
        **hub,
    )
    if model_args.replace_qa_head:
        reset_answer_layer(model)
    return model, tokenizer, num_labels


def reset_answer_layer(model: Any) -> None:
    """The last answer layer re-initialized (`initializer_range` normal weights, zero bias), as Optimum Graphcore's
    `--replace_qa_head` did; left alone on a process whose stage does not hold it (the meta device)."""
    layer = model.answer_head.logit_fc[-1]
    if layer.weight.is_meta:
        return
    with torch.no_grad():
        layer.weight.normal_(mean=0.0, std=model.config.initializer_range)
        layer.bias.zero_()


def region_arrays(
    features: list, boxes: list, config: Any, source: str, questions: list | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """
    A batch's region features and boxes as float32 arrays (rows x regions x dims), checked against the model.

    Raises:
        `ValueError`: one line naming the source, what is wrong (shape, dims) and the fix.
    """
    try:
        feats = np.asarray(features, dtype=np.float32)
        pos = np.asarray(boxes, dtype=np.float32)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{source}: features or normalized_boxes are not regions x numbers of one shape in every row ({err})"
        ) from None
    if feats.ndim != 3 or feats.shape[2] != config.visual_feat_dim:
        got = "x".join(map(str, feats.shape[1:])) or "a number"
        raise ValueError(
            f"{source}: features are {got} per row; the model takes regions x {config.visual_feat_dim} "
            "(visual_feat_dim): give features of that size, or a model of that visual_feat_dim"
        )
    if pos.ndim != 3 or pos.shape[2] != config.visual_pos_dim:
        got = "x".join(map(str, pos.shape[1:])) or "a number"
        raise ValueError(
            f"{source}: normalized_boxes are {got} per row; expected regions x {config.visual_pos_dim} "
            "(x1, y1, x2, y2 in [0, 1], one box per region)"
        )
    if pos.shape[1] != feats.shape[1]:
        raise ValueError(
            f"{source}: {feats.shape[1]} regions of features but {pos.shape[1]} normalized_boxes per row; "
            "give one box per region"
        )
    for name, values in (("features", feats), ("normalized_boxes", pos)):
        bad = ~np.isfinite(values).all(axis=(1, 2))
        if bad.any():  # a NaN region trains and evaluates to a NaN loss beside a plausible accuracy
            first = f" (first: the row asking {questions[int(np.argmax(bad))]!r})" if questions else ""
            raise ValueError(
                f"{source}: the {name} of {int(bad.sum())} rows hold NaN or infinite values{first}; give finite "
                "numbers, or leave those rows out"
            )
    return feats, pos


def is_class_id(value: Any) -> bool:
    """A whole number that is not a boolean: JSON's `true` reads as a `bool`, which Python counts as 1."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def encode_labels(labels: list, soft: bool, num_labels: int, source: str) -> list:
    """Class ids as they are, or soft labels as dense vectors of `num_labels` with each id's weight (checked)."""
    fix = f"the model's answer head has {num_labels} answers (num_qa_labels): use ids below it, or --replace_qa_head"
    if not soft:
        for label in labels:
            if not is_class_id(label) or not 0 <= label < num_labels:
                raise ValueError(f"{source}: label {label!r} is not an answer class id; {fix}")
        return labels
    dense = []
    for label in labels:
        ids, weights = (label or {}).get("ids"), (label or {}).get("weights")
        if ids is None or weights is None or len(ids) != len(weights):
            raise ValueError(
                f"{source}: label {label!r}: a soft label is {{'ids': [...], 'weights': [...]}}, alike long"
            )
        vector = np.zeros(num_labels, dtype=np.float32)
        for answer, weight in zip(ids, weights, strict=True):
            if not is_class_id(answer) or not 0 <= answer < num_labels:
                raise ValueError(f"{source}: soft label id {answer!r} is not an answer class id; {fix}")
            # VQA's score is the top answer's weight: one above 1 or below 0 made accuracies of 1.875 or -0.94
            if isinstance(weight, bool) or not isinstance(weight, (int, float, np.number)) or not 0 <= weight <= 1:
                raise ValueError(
                    f"{source}: soft label {label!r}: weight {weight!r} of answer {answer} is not a share in [0, 1] "
                    "(the share of annotators giving that answer); give weights in [0, 1]"
                )
            vector[answer] = weight
        dense.append(vector)
    return dense


def tokenized_splits(
    raw: dict[str, datasets.Dataset],
    sources: Mapping[str, str],
    tokenizer: Any,
    config: Any,
    soft: bool,
    data_args: DataTrainingArguments,
    training_args: IPUTrainingArguments,
) -> dict[str, datasets.Dataset]:
    """Each split as the model's inputs: the question tokenized, `visual_feats` and `visual_pos` from the region
    features and boxes, and `labels` (class ids, or soft labels' dense vectors); the first --max_*_samples kept."""
    max_seq_length = min(data_args.max_seq_length, example_utils.max_model_length(tokenizer, config))
    if data_args.max_seq_length > max_seq_length:
        logger.warning(
            "--max_seq_length %d is longer than the model takes: %d", data_args.max_seq_length, max_seq_length
        )

    def preprocess_for(source: str) -> Callable[[dict[str, list]], dict[str, Any]]:
        def preprocess(examples: dict[str, list]) -> dict[str, Any]:
            padding = "max_length" if data_args.pad_to_max_length else False
            result = dict(tokenizer(examples["question"], truncation=True, max_length=max_seq_length, padding=padding))
            result["visual_feats"], result["visual_pos"] = region_arrays(
                examples["features"], examples["normalized_boxes"], config, source, examples["question"]
            )
            if "label" in examples:
                result["labels"] = encode_labels(examples["label"], soft, config.num_qa_labels, source)
            return result

        return preprocess

    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
    limits["test"] = data_args.max_predict_samples
    return {
        split: example_utils.tokenize_split(
            raw, split, preprocess_for(sources[split]), training_args, data_args, limits[split], f"--{SPLITS[split]}"
        )
        for split in raw
    }


def soft_label_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """Optimum Graphcore's LXMERT loss for soft labels (VQA v2): binary cross-entropy of every answer's logit
    against its weight, the mean over the batch's answers (a `Trainer` `compute_loss_func`; the stock
    `LxmertForQuestionAnswering` computes cross-entropy over class ids only)."""
    scores = outputs["question_answering_score"] if isinstance(outputs, Mapping) else outputs[0]
    return F.binary_cross_entropy_with_logits(scores.float(), labels.to(torch.float32).view_as(scores))


def metrics_for(soft: bool, num_labels: int) -> Callable[[EvalPrediction], dict[str, float]]:
    """Accuracy: the top answer against the class id (torchmetrics), or with soft labels the mean weight of the top
    answer, as Optimum Graphcore's script computed it."""

    def compute_metrics(p: EvalPrediction) -> dict[str, float]:
        scores = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        top = np.argmax(scores, axis=-1)
        labels = np.asarray(p.label_ids)
        if soft:
            return {"accuracy": float(np.mean(labels[np.arange(len(top)), top]))}
        preds, target = torch.as_tensor(top), torch.as_tensor(labels).long()
        return {"accuracy": float(accuracy(preds, target, task="multiclass", num_classes=num_labels))}

    return compute_metrics


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw, sources = load_raw_datasets(data_args, model_args, example_utils.requested_splits(training_args))
    soft = check_layout(raw, sources, data_args.soft_label)
    classes = answer_classes(raw)
    model, tokenizer, num_labels = load_model_and_tokenizer(model_args, training_args, classes)
    splits = tokenized_splits(raw, sources, tokenizer, model.config, soft, data_args, training_args)
    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)
    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=splits.get("train"),
        eval_dataset=splits.get("validation"),
        compute_metrics=metrics_for(soft, num_labels),
        compute_loss_func=soft_label_loss if soft else None,  # class ids: the stock model's cross-entropy
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
        class_name = classes.int2str if classes is not None else int  # the class name when the data names them
        example_utils.write_class_predictions(trainer, splits["test"], class_name)
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
