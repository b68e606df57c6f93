#!/usr/bin/env python
"""Fine-tune a `transformers` model for multiple choice (SWAG) with `IPUTrainer`.

The recipe of Optimum Graphcore's `run_swag.py`, run from this folder (it reads `./ipu_config.json`):

    python run_swag.py --ipu_config_name=./ --model_name_or_path roberta-base --do_train --do_eval \\
      --learning_rate 5e-5 --num_train_epochs 3 --max_seq_length 80 --output_dir ./output/swag_base \\
      --per_device_eval_batch_size 2 --per_device_train_batch_size 2 --overwrite_output_dir

Without files it reads `swag` (`regular`) from the Hugging Face Hub (downloaded once, then from the local datasets
cache). Without a network, give local files instead: `--train_file` / `--validation_file` take CSV or JSON (lines)
in SWAG's layout: a context `sent1`, the start of the continuation `sent2`, four endings `ending0`..`ending3` and the
index of the right one, `label`. Writes `train_results.json`, `eval_results.json` and `all_results.json`
(`eval_accuracy`, ...) and, after training, `training_curves.png`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import logging
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
import torch
from torchmetrics.functional import accuracy
from transformers import (
    AutoConfig,
    AutoModelForMultipleChoice,
    AutoTokenizer,
    DataCollatorForMultipleChoice,
    EvalPrediction,
    PretrainedConfig,
    default_data_collator,
    set_seed,
)

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script

logger = logging.getLogger(__name__)

FILE_FORMATS = ("csv", "json", "jsonl")
ENDINGS = [f"ending{i}" for i in range(4)]
CONTEXT, QUESTION_HEADER = "sent1", "sent2"
LONGEST_DEFAULT = 1024  # `transformers`' run_swag.py: without --max_seq_length, at most this many tokens


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize it."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Dataset id on the Hugging Face Hub, or a local dataset folder (default: swag)."},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: CSV or JSON(L), SWAG layout."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same formats."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_seq_length: int | None = field(
        default=None, metadata={"help": "Tokens per choice; default: the longest the tokenizer and model take."}
    )
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every choice to max_seq_length (static shapes, one compiled graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})

    def __post_init__(self) -> None:
        for name in ("train_file", "validation_file"):
            path = getattr(self, name)
            if path is not None and path.rsplit(".", 1)[-1].lower() not in FILE_FORMATS:
                raise ValueError(f"--{name} {path}: expected a {', '.join(FILE_FORMATS)} file")


def load_raw_datasets(data: DataTrainingArguments, model: example_utils.ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation splits, from local files or the Hugging Face Hub (`swag`, `regular`) or its cache."""
    files = {"train": data.train_file, "validation": data.validation_file}
    if any(files.values()):
        return example_utils.load_data_files(files, model.cache_dir)
    name = data.dataset_name or "swag"
    config = data.dataset_config_name or ("regular" if name == "swag" else None)
    hint = "--train_file train.csv --validation_file val.csv (SWAG's CSV layout, or the same columns in JSON lines)"
    raw = example_utils.load_hub_dataset(
        name, config, local_files_hint=hint, cache_dir=model.cache_dir, token=model.token
    )
    return dict(raw)


def check_columns(raw: dict[str, datasets.Dataset]) -> None:
    for split_name, split in raw.items():
        missing = [c for c in (CONTEXT, QUESTION_HEADER, *ENDINGS, "label") if c not in split.column_names]
        if missing:
            raise ValueError(
                f"the {split_name} data has no column {', '.join(missing)} (columns: {', '.join(split.column_names)})"
                f"; run_swag.py reads SWAG's layout: {CONTEXT}, {QUESTION_HEADER}, {', '.join(ENDINGS)}, label"
            )


def compute_metrics(p: EvalPrediction) -> dict[str, float]:
    """Accuracy of the highest-scoring choice (torchmetrics)."""
    logits = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
    preds = torch.as_tensor(np.argmax(logits, axis=1))
    labels = torch.as_tensor(np.asarray(p.label_ids)).long()
    return {"accuracy": float(accuracy(preds, labels, task="multiclass", num_classes=logits.shape[1]))}


def sequence_length(tokenizer: Any, config: PretrainedConfig, wanted: int | None) -> int:
    """`--max_seq_length`, within what the model takes (default: the longest, at most 1024 as upstream)."""
    longest = example_utils.max_model_length(tokenizer, config)
    if wanted is None:
        if longest > LONGEST_DEFAULT:
            logger.warning("the tokenizer takes %d tokens: using %d; set --max_seq_length", longest, LONGEST_DEFAULT)
        return min(longest, LONGEST_DEFAULT)
    if wanted > longest:
        logger.warning("max_seq_length %d > the model's %d: using the latter", wanted, longest)
    return min(wanted, longest)


def preprocessor(tokenizer: Any, max_seq_length: int, pad_to_max_length: bool) -> Any:
    """Each example becomes four (context, header + ending) pairs, tokenized flat and regrouped by four."""
    padding = "max_length" if pad_to_max_length else False

    def preprocess(examples: dict[str, list]) -> dict[str, list]:
        first = [context for context in examples[CONTEXT] for _ in ENDINGS]
        second = [
            f"{header} {examples[ending][i]}"
            for i, header in enumerate(examples[QUESTION_HEADER])
            for ending in ENDINGS
        ]
        flat = tokenizer(first, second, truncation=True, max_length=max_seq_length, padding=padding)
        choices = len(ENDINGS)
        result = {
            key: [values[i : i + choices] for i in range(0, len(values), choices)] for key, values in flat.items()
        }
        result["labels"] = list(examples["label"])
        return result

    return preprocess


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        example_utils.ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)
    check_columns(raw)

    hub = model_args.hub_kwargs()
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer, **hub
    )
    model = example_utils.load_pretrained(
        AutoModelForMultipleChoice, model_args.model_name_or_path, training_args, config=config, **hub
    )
    max_seq_length = sequence_length(tokenizer, config, data_args.max_seq_length)
    preprocess = preprocessor(tokenizer, max_seq_length, data_args.pad_to_max_length)

    def tokenized(split: str, limit: int | None, flag: str) -> datasets.Dataset:
        return example_utils.tokenize_split(raw, split, preprocess, training_args, data_args, limit, flag)

    train_dataset = tokenized("train", data_args.max_train_samples, "--do_train") if training_args.do_train else None
    eval_dataset = tokenized("validation", data_args.max_eval_samples, "--do_eval") if training_args.do_eval else None
    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorForMultipleChoice(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)
    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics,
    )
    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(train_dataset)):
            return
    if training_args.do_eval:
        example_utils.evaluate(trainer, len(eval_dataset))
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
