#!/usr/bin/env python
"""Fine-tune a `transformers` model for multiple choice (SWAG) with `IPUTrainer`.

The recipe of Optimum Graphcore's `run_swag.py`, run from this folder (it reads `./ipu_config.json`):

    python run_swag.py --ipu_config_name=./ --model_name_or_path roberta-base --do_train --do_eval \\
      --learning_rate 5e-5 --num_train_epochs 3 --max_seq_length 80 --output_dir ./output/swag_base \\
      --per_device_eval_batch_size 2 --per_device_train_batch_size 2 --overwrite_output_dir

Without files it reads `swag` (`regular`) from the local datasets cache. Offline, give local files instead:
`--train_file` / `--validation_file` take CSV or JSON (lines) in SWAG's layout: a context `sent1`, the start of
the continuation `sent2`, four endings `ending0`..`ending3` and the index of the right one, `label`.
Writes `train_results.json`, `eval_results.json` and `all_results.json` (`eval_accuracy`, ...).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import datasets
import numpy as np
import torch
import transformers
from torchmetrics.functional import accuracy
from transformers import (
    AutoConfig,
    AutoModelForMultipleChoice,
    AutoTokenizer,
    DataCollatorForMultipleChoice,
    EvalPrediction,
    HfArgumentParser,
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


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize it."""

    dataset_name: str | None = field(default=None, metadata={"help": "Dataset name; default: swag (local cache)."})
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


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation splits, from local files or the local datasets cache (`swag`, `regular`)."""
    files = {"train": data.train_file, "validation": data.validation_file}
    if any(files.values()):
        raw = {}
        for split, path in files.items():
            if path is None:
                continue
            if not os.path.isfile(path):
                raise FileNotFoundError(f"--{split}_file {path}: no such file")
            builder = "csv" if path.lower().endswith(".csv") else "json"
            raw[split] = datasets.load_dataset(builder, data_files={split: path}, cache_dir=model.cache_dir)[split]
        return raw
    name = data.dataset_name or "swag"
    config = data.dataset_config_name or ("regular" if name == "swag" else None)
    try:
        return dict(datasets.load_dataset(name, config, cache_dir=model.cache_dir, token=model.token))
    except Exception as err:  # offline: DatasetNotFoundError, ConnectionError, OfflineModeIsEnabled, ...
        raise SystemExit(
            f"--dataset_name {name} ({config}): not in the local datasets cache and the Hub cannot be reached "
            f"({type(err).__name__}). Pass local files instead, e.g. --train_file "
            "../../../shared/data/fixtures/swag/sample.json --validation_file (the same file)"
        ) from None


def max_model_length(tokenizer: transformers.PreTrainedTokenizerBase, config: PretrainedConfig) -> int:
    """The longest sequence both the tokenizer and the model's position table take."""
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions and config.model_type in ("roberta", "xlm-roberta", "camembert"):
        positions -= (config.pad_token_id or 0) + 1  # RoBERTa's positions start after the padding index
    return min(tokenizer.model_max_length, positions or tokenizer.model_max_length)


def compute_metrics(p: EvalPrediction) -> dict[str, float]:
    """Accuracy of the highest-scoring choice (torchmetrics)."""
    logits = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
    preds = torch.as_tensor(np.argmax(logits, axis=1))
    labels = torch.as_tensor(np.asarray(p.label_ids)).long()
    return {"accuracy": float(accuracy(preds, labels, task="multiclass", num_classes=logits.shape[1]))}


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
    raw = load_raw_datasets(data_args, model_args)
    for split_name, split in raw.items():
        missing = [c for c in (CONTEXT, QUESTION_HEADER, *ENDINGS, "label") if c not in split.column_names]
        if missing:
            raise ValueError(
                f"the {split_name} data has no column {', '.join(missing)} (columns: {', '.join(split.column_names)})"
                f"; run_swag.py reads SWAG's layout: {CONTEXT}, {QUESTION_HEADER}, {', '.join(ENDINGS)}, label"
            )

    hub = {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer, **hub
    )
    model = AutoModelForMultipleChoice.from_pretrained(model_args.model_name_or_path, config=config, **hub)

    longest = max_model_length(tokenizer, config)
    if data_args.max_seq_length is None:
        max_seq_length = min(longest, LONGEST_DEFAULT)
        if longest > LONGEST_DEFAULT:
            logger.warning("the tokenizer takes %d tokens: using %d; set --max_seq_length", longest, LONGEST_DEFAULT)
    else:
        max_seq_length = min(data_args.max_seq_length, longest)
        if data_args.max_seq_length > longest:
            logger.warning("max_seq_length %d > the model's %d: using the latter", data_args.max_seq_length, longest)
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess(examples: dict[str, list]) -> dict[str, list]:
        # Each example becomes four (context, header + ending) pairs, tokenized flat and regrouped by four.
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

    def tokenized(split: str, limit: int | None, flag: str) -> datasets.Dataset:
        if split not in raw:
            raise ValueError(f"{flag} needs a {split} dataset: give --{split}_file")
        examples = raw[split]
        if limit is not None:
            examples = examples.select(range(min(limit, len(examples))))
        with training_args.main_process_first(desc=f"tokenize {split}"):
            return examples.map(
                preprocess,
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=examples.column_names,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Running tokenizer on {split}",
            )

    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = tokenized("train", data_args.max_train_samples, "--do_train")
    if training_args.do_eval:
        eval_dataset = tokenized("validation", data_args.max_eval_samples, "--do_eval")

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
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        if training_args.compile_only:
            logger.info("--compile_only: graphs compiled and cached; nothing trained or saved")
            return
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.save_model()
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
