#!/usr/bin/env python
"""Train or fine-tune a causal language model (GPT-2, ...) on a text corpus with `IPUTrainer`.

The recipe of Optimum Graphcore's `run_clm.py` (the flags of the `transformers` v4 example plus `--ipu_config_name`):

    python run_clm.py --model_name_or_path gpt2 --ipu_config_name Graphcore/gpt2-small-ipu \\
      --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 --do_train --do_eval \\
      --num_train_epochs 10 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 \\
      --gradient_accumulation_steps 128 --learning_rate 1e-5 --lr_scheduler_type linear --loss_scaling 16384 \\
      --weight_decay 0.01 --warmup_ratio 0.1 --output_dir /tmp/clm_output --n_ipu 16

Offline, give local text files (`--train_file` / `--validation_file`; `.txt`, `.tokens`, `.raw`, CSV or JSON) and a
local model folder, or train from scratch: `--model_type gpt2 --tokenizer_name DIR --config_overrides
"n_embd=128,..."` (see README.md; `train_tokenizer.py` builds a tokenizer from the text files). Texts are
concatenated and cut into blocks of `--block_size` tokens (the remainder of each batch of texts is dropped, so every
block is full: static shapes). Writes `train_results.json`, `eval_results.json` and `all_results.json` with
`eval_loss`, `eval_accuracy` and `perplexity = exp(eval_loss)`.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, default_data_collator, set_seed
from utils_lm import (
    ModelArguments,
    check_data_arguments,
    load_config_and_tokenizer,
    load_model,
    load_raw_datasets,
    perplexity,
    preprocess_logits_for_metrics,
    select_splits,
    sequence_length,
    setup_logging,
    text_column,
    token_accuracy,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the shared example_utils package
import example_utils  # noqa: E402

from optimum_ipu import IPUTrainer, IPUTrainingArguments  # noqa: E402
from optimum_ipu.errors import run_script  # noqa: E402

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to cut it into blocks."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hub, or a local dataset folder."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Training text (.txt/.tokens/.raw, CSV, JSON)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation text, same formats."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation blocks."})
    block_size: int | None = field(
        default=None,
        metadata={"help": "Tokens per training block (default: the model's maximum, at most 1024)."},
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    validation_split_percentage: int = field(
        default=5,
        metadata={"help": "Percentage of the training set used for validation when there is no validation set."},
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    keep_linebreaks: bool = field(default=True, metadata={"help": "Keep line breaks of text files."})

    def __post_init__(self) -> None:
        check_data_arguments(self)


def group_texts(examples: dict[str, list[list[Any]]], block_size: int) -> dict[str, list[list[Any]]]:
    """Concatenate the tokenized texts and cut them into full blocks of `block_size`; labels are the inputs (the
    model shifts them). The remainder is dropped, so every block has the same length."""
    concatenated = {k: list(chain(*examples[k])) for k in examples}
    total_length = (len(concatenated["input_ids"]) // block_size) * block_size
    result = {k: [t[i : i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated.items()}
    result["labels"] = result["input_ids"].copy()
    return result


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    setup_logging(logger, training_args)

    last_checkpoint = example_utils.start_run(training_args)

    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)
    config, tokenizer = load_config_and_tokenizer(model_args)
    model = load_model(AutoModelForCausalLM, model_args, config, tokenizer)

    split = "train" if training_args.do_train else "validation"
    if split not in raw:
        raise ValueError(f"--do_{'train' if split == 'train' else 'eval'} requires a {split} dataset")
    column_names = list(raw[split].features)
    text = text_column(raw[split])

    def tokenize(examples: dict[str, list[str]]) -> Any:
        return tokenizer(examples[text])

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized = raw.map(
            tokenize,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=column_names,
            load_from_cache_file=not data_args.overwrite_cache,
            desc="Running tokenizer on dataset",
        )
    block_size = sequence_length(data_args.block_size, "block_size", tokenizer, model.config)
    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized.map(
            group_texts,
            fn_kwargs={"block_size": block_size},
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            desc=f"Grouping texts in chunks of {block_size}",
        )

    train_dataset, eval_dataset = select_splits(lm_datasets, data_args, training_args)
    for name, dataset in (("training", train_dataset), ("evaluation", eval_dataset)):
        if dataset is not None and len(dataset) == 0:
            raise ValueError(
                f"the {name} text gives no full block of {block_size} tokens; lower --block_size or give more text"
            )

    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        # Every block has the same length: no padding to do (the default collator would pad).
        data_collator=default_data_collator,
        compute_metrics=token_accuracy(model.config.vocab_size, causal=True) if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics if training_args.do_eval else None,
    )

    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(train_dataset)):
            return

    if training_args.do_eval:
        example_utils.evaluate(
            trainer, len(eval_dataset), lambda metrics: {"perplexity": perplexity(metrics["eval_loss"])}
        )
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
