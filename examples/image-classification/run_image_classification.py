#!/usr/bin/env python
"""Fine-tune (or train from scratch) a `transformers` image classifier (ViT, ConvNeXt, ...) with `IPUTrainer`.

The flags of the `transformers` example of the same name, plus `--ipu_config_name` and the other
`IPUTrainingArguments`. From this folder (it reads `./ipu_config.json`), the recipe of Optimum Graphcore:

    python run_image_classification.py --ipu_config_name=./ --model_name_or_path google/vit-base-patch16-224-in21k \\
      --dataset_name cifar10 --output_dir ./outputs/ --remove_unused_columns False --do_train --do_eval \\
      --learning_rate 2e-5 --num_train_epochs 5 --per_device_train_batch_size 1 --per_device_eval_batch_size 1

Data: `--dataset_name` (from the Hugging Face Hub or its local cache), or `--train_dir` / `--validation_dir`, folders
in the `imagefolder` layout (`<dir>/<label>/<image>`, the folder names are the labels); without a validation split,
`--train_val_split` of the training images are held out. Images pass through the model's image processor
(resize, rescale, normalize; grayscale images become RGB). Without pretrained weights, train from scratch:
`--model_type vit --config_overrides "image_size=32,patch_size=4,..."` (the image processor is then the
family's, sized to the config's `image_size`). Writes `train_results.json`, `eval_results.json` (`eval_accuracy`,
from `torchmetrics`), `all_results.json`, and the model with its image processor and `ipu_config.json`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import datasets
import torch
import transformers
from example_utils import classification
from transformers import AutoImageProcessor, AutoModelForImageClassification, set_seed
from transformers.models.auto import image_processing_auto
from transformers.utils import is_torchvision_available

from optimum_ipu import IPUTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.pipelines.images import load_image

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "google/vit-base-patch16-224-in21k"  # without --model_name_or_path, --model_type or --config_name


@dataclass
class ModelArguments:
    """Which model, config and image processor to fine-tune (or which family to train from scratch)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Model id on the Hugging Face Hub (downloaded once, then cached) or a folder (default, without "
            f"--model_type or --config_name to train from scratch: {DEFAULT_MODEL})."
        },
    )
    model_type: str | None = field(default=None, metadata={"help": "Family to train from scratch, e.g. vit, convnext."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "From scratch: config values, e.g. 'image_size=32,patch_size=4'."}
    )
    config_name: str | None = field(default=None, metadata={"help": "Config folder or id, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model."})
    image_processor_name: str | None = field(default=None, metadata={"help": "Image processor folder or id."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a model whose classification head has another number of labels."}
    )

    def __post_init__(self) -> None:
        classification.check_model_arguments(self, "vit, convnext")
        if self.model_name_or_path is None and self.model_type is None and self.config_name is None:
            # as Optimum Graphcore's (and transformers') script: its README's --train_dir command gives no model
            self.model_name_or_path = DEFAULT_MODEL
            logger.info("--model_name_or_path not given: fine-tuning %s (as Optimum Graphcore did)", DEFAULT_MODEL)


@dataclass
class DataTrainingArguments:
    """What images to train and evaluate on."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hub, or a local dataset folder."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_dir: str | None = field(default=None, metadata={"help": "Training images: <dir>/<label>/<image>."})
    validation_dir: str | None = field(default=None, metadata={"help": "Evaluation images, same layout."})
    train_val_split: float = field(
        default=0.15, metadata={"help": "Share of training images held out if no validation split is given."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    image_column_name: str = field(default="image", metadata={"help": "The column of the images."})
    label_column_name: str = field(default="label", metadata={"help": "The column of the labels."})

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_dir is None and self.validation_dir is None:
            raise ValueError("give --dataset_name or --train_dir/--validation_dir (imagefolder layout)")
        for name in ("train_dir", "validation_dir"):
            path = getattr(self, name)
            if path is not None and not os.path.isdir(path):
                raise ValueError(f"--{name} {path}: no such folder; expected <dir>/<label>/<image> files")
        if not 0.0 <= self.train_val_split < 1.0:
            raise ValueError(f"--train_val_split {self.train_val_split}: expected a share in [0, 1)")


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> datasets.DatasetDict:
    """The train / validation images, from `imagefolder` folders or the local `datasets` cache."""
    if data.dataset_name is None:
        files = {"train": data.train_dir, "validation": data.validation_dir}
        data_files = {split: os.path.join(path, "**") for split, path in files.items() if path is not None}
        return datasets.load_dataset("imagefolder", data_files=data_files, cache_dir=model.cache_dir)
    return example_utils.load_hub_dataset(
        data.dataset_name,
        data.dataset_config_name,
        local_files_hint="--train_dir train --validation_dir validation (imagefolder layout: a sub-folder per class)",
        cache_dir=model.cache_dir,
        token=model.token,
    )


def build_model(
    model_args: ModelArguments, labels: list[str], training_args: IPUTrainingArguments
) -> tuple[transformers.PreTrainedModel, transformers.BaseImageProcessor]:
    """The classifier (pretrained, or new from `--model_type` / `--config_name`) with the data's labels, and its
    image processor."""
    model, config = classification.load_classifier(
        AutoModelForImageClassification, model_args, labels, "image-classification", training_args
    )
    source = model_args.image_processor_name or model_args.model_name_or_path
    if source:
        processor = AutoImageProcessor.from_pretrained(source, **example_utils.hub_kwargs(model_args))
    else:
        processor = family_image_processor(config)
    return model, processor


def family_image_processor(config: transformers.PretrainedConfig) -> transformers.BaseImageProcessor:
    """The default image processor of a config's family, sized to its `image_size`: what a model trained from
    scratch is fed (and saved with)."""
    names = image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(config.model_type)
    if not names:
        raise ValueError(
            f"--model_type {config.model_type}: transformers has no image processor for it; pass --image_processor_name"
        )
    name = names if isinstance(names, str) else names["torchvision" if is_torchvision_available() else "pil"]
    processor = image_processing_auto.get_image_processor_class_from_name(name)()
    side = getattr(config, "image_size", None)
    if isinstance(side, int):
        square = {"height": side, "width": side}
        processor.size = {"shortest_edge": side} if "shortest_edge" in processor.size else square
        if hasattr(processor, "crop_size"):
            processor.crop_size = {"height": side, "width": side}
        if hasattr(processor, "crop_pct"):
            processor.crop_pct = 1.0  # the whole image, resized: a small image has no margin to crop
    return processor


def collate_fn(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack the processed images and their labels."""
    return {
        "pixel_values": torch.stack([torch.as_tensor(e["pixel_values"]) for e in examples]),
        "labels": torch.tensor([e["labels"] for e in examples], dtype=torch.long),
    }


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)

    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args)
    if "validation" not in raw and training_args.do_eval and data_args.train_val_split > 0:
        split = raw["train"].train_test_split(data_args.train_val_split, seed=training_args.seed)
        raw["train"], raw["validation"] = split["train"], split["test"]
    image_column, label_column = data_args.image_column_name, data_args.label_column_name
    example_utils.check_columns(raw, {"--image_column_name": image_column, "--label_column_name": label_column})
    for split in raw:  # decoded by load_image (which names a damaged file), not by datasets on access
        if isinstance(raw[split].features[image_column], datasets.Image):
            raw[split] = raw[split].cast_column(image_column, datasets.Image(decode=False))
    labels = classification.label_names(raw, label_column, "validation")
    model, image_processor = build_model(model_args, labels, training_args)
    label_ids = classification.label_encoder(raw, label_column, labels)

    def transform(batch: dict[str, list]) -> dict[str, list]:
        """The image processor on each image (decoded as RGB, a damaged file named); labels as class ids. Applied on
        the fly."""
        images = [load_image(image) for image in batch[image_column]]
        pixels = image_processor(images, return_tensors="pt")["pixel_values"]
        return {"pixel_values": list(pixels), "labels": label_ids(batch[label_column])}

    def prepared(split: str, limit: int | None, flag: str) -> datasets.Dataset:
        return classification.transformed_split(raw, split, limit, flag, training_args.seed, transform)

    splits = {
        "train": lambda: prepared("train", data_args.max_train_samples, "--do_train"),
        "eval": lambda: prepared("validation", data_args.max_eval_samples, "--do_eval"),
    }
    classification.train_and_evaluate(
        model, training_args, splits, len(labels), image_processor, collate_fn, last_checkpoint, model_args, data_args
    )


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
