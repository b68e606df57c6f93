"""What the classifiers of raw inputs share (`run_image_classification.py`, `run_audio_classification.py`): the label
names and their ids, the model (pretrained, or new from `--model_type` / `--config_name`) with the data's labels,
the splits transformed on the fly, and top-1 accuracy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from torchmetrics.functional import accuracy
from transformers import AutoConfig, EvalPrediction

import example_utils

logger = logging.getLogger(__name__)


def check_model_arguments(model_args: Any, examples: str) -> None:
    """The checks of the from-scratch flags: a known `--model_type` (`examples` names a few), and
    `--config_overrides` only without `--model_name_or_path`."""
    if model_args.model_type is not None and model_args.model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(f"--model_type {model_args.model_type}: unknown to transformers; e.g. {examples}")
    if model_args.config_overrides is not None and model_args.model_name_or_path is not None:
        raise ValueError(
            "--config_overrides changes the config of a model trained from scratch; leave out "
            "--model_name_or_path, or use --config_name"
        )


def label_names(raw: dict[str, datasets.Dataset], column: str, reference: str) -> list[str]:
    """The label names: a `ClassLabel`'s names (of the `train` split, else `reference`), else the sorted distinct
    values of every split."""
    feature = raw["train" if "train" in raw else reference].features[column]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    return [str(v) for v in sorted({v for split in raw.values() for v in split.unique(column)})]


def label_encoder(raw: dict[str, datasets.Dataset], column: str, labels: list[str]) -> Callable[[list], list[int]]:
    """A batch of the label column -> class ids: as they are for a `ClassLabel`, else the index of each value's
    name in `labels`."""
    if isinstance(raw[next(iter(raw))].features[column], datasets.ClassLabel):
        return lambda values: values
    label_to_id = {name: i for i, name in enumerate(labels)}
    return lambda values: [label_to_id[str(v)] for v in values]


def load_classifier(
    auto_class: Any, model_args: Any, labels: list[str], task: str, training_args: Any
) -> tuple[transformers.PreTrainedModel, transformers.PretrainedConfig]:
    """
    The classifier with the data's labels, and its config.

    Args:
        auto_class: `AutoModelForImageClassification`, `AutoModelForAudioClassification`, ...
        model_args: The script's model arguments (`model_name_or_path`, `model_type`, `config_name`,
            `config_overrides`, `ignore_mismatched_sizes` and the Hub fields).
        labels (`list[str]`): The label names, in class-id order.
        task (`str`): The config's `finetuning_task`.
        training_args (`IPUTrainingArguments`): The run's arguments (`example_utils.load_pretrained`).
    """
    hub = example_utils.hub_kwargs(model_args)
    label_kwargs = {
        "num_labels": len(labels),
        "label2id": {n: i for i, n in enumerate(labels)},
        "id2label": dict(enumerate(labels)),
        "finetuning_task": task,
    }
    if model_args.config_name or model_args.model_name_or_path:
        config = AutoConfig.from_pretrained(
            model_args.config_name or model_args.model_name_or_path, **label_kwargs, **hub
        )
    else:
        config = example_utils.new_config(model_args.model_type, model_args.config_overrides)
        config.update(label_kwargs)
    if not model_args.model_name_or_path:
        logger.info("Training a new %s model from scratch", config.model_type)
        return auto_class.from_config(config, trust_remote_code=model_args.trust_remote_code), config
    model = example_utils.load_pretrained(
        auto_class,
        model_args.model_name_or_path,
        training_args,
        config=config,
        ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
        **hub,
    )
    return model, config


def transformed_split(
    raw: dict[str, datasets.Dataset],
    split: str,
    limit: int | None,
    flag: str,
    seed: int,
    transform: Callable[[dict[str, list]], dict[str, list]],
) -> datasets.Dataset:
    """
    `raw[split]` with `transform` applied on the fly; with `limit` (`--max_*_samples`), that many examples of it
    shuffled by `seed`.

    Raises:
        `ValueError`: if the split is missing (`flag` is the option that needs it, e.g. `--do_eval`).
    """
    if split not in raw:
        raise ValueError(f"{flag} needs a {split} dataset: give --{split}_dir (or --dataset_name with one)")
    dataset = raw[split]
    if limit is not None:
        dataset = dataset.shuffle(seed=seed).select(range(min(limit, len(dataset))))
    return dataset.with_transform(transform)


def accuracy_metric(num_labels: int) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics`: top-1 accuracy (`accuracy`) by torchmetrics."""

    def compute(p: EvalPrediction) -> dict[str, float]:
        logits = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        preds = torch.as_tensor(np.argmax(logits, axis=-1))
        labels = torch.as_tensor(np.asarray(p.label_ids)).long()
        classes = max(num_labels, 2)
        return {"accuracy": float(accuracy(preds, labels, task="multiclass", num_classes=classes, average="micro"))}

    return compute


def train_and_evaluate(
    model: Any,
    args: Any,
    splits: dict[str, Callable[[], datasets.Dataset]],
    num_labels: int,
    processing_class: Any,
    collate_fn: Callable[[list], dict[str, Any]],
    last_checkpoint: str | None,
    model_args: Any,
    data_args: Any,
) -> None:
    """The audio and image scripts' run once their splits are ready: `IPUTrainer` with accuracy, then train, evaluate
    and finish (`example_utils.train` / `evaluate` / `finish`).

    Args:
        splits (`dict`): `"train"` and `"eval"` -> a function making the split (called only when `--do_train` /
            `--do_eval` asks for it).
    """
    from optimum_ipu import IPUTrainer

    train_dataset = splits["train"]() if args.do_train else None
    eval_dataset = splits["eval"]() if args.do_eval else None
    args.remove_unused_columns = False  # the on-the-fly transform reads the raw column: keep it
    trainer = IPUTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=accuracy_metric(num_labels),
        processing_class=processing_class,
        data_collator=collate_fn,
    )
    if args.do_train and not example_utils.train(trainer, args, last_checkpoint, len(train_dataset)):
        return
    if args.do_eval:
        example_utils.evaluate(trainer, len(eval_dataset))
    example_utils.finish(trainer, args, model_args, data_args)
