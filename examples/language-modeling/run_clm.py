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

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import logging
from dataclasses import dataclass, field
from typing import Any

from example_utils import language_modeling as lm
from example_utils.peft import PeftArguments, maybe_wrap_with_lora
from transformers import AutoModelForCausalLM, default_data_collator, set_seed

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script

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
        lm.check_data_arguments(self)


def main() -> None:
    model_args, data_args, training_args, peft_args = example_utils.parse_args(
        lm.ModelArguments, DataTrainingArguments, IPUTrainingArguments, PeftArguments
    )
    example_utils.setup_logging(training_args, logger)

    last_checkpoint = example_utils.start_run(training_args)

    set_seed(training_args.seed)
    raw = lm.load_raw_datasets(data_args, model_args)
    config, tokenizer = lm.load_config_and_tokenizer(model_args)
    model = lm.load_model(AutoModelForCausalLM, model_args, config, tokenizer, training_args)
    model = maybe_wrap_with_lora(model, peft_args, "CAUSAL_LM")

    text, _ = lm.raw_text_columns(raw, training_args)

    def tokenize(examples: dict[str, list[str]]) -> Any:
        return tokenizer(examples[text])

    block_size = lm.sequence_length(data_args.block_size, "block_size", tokenizer, model.config)
    lm_datasets = lm.tokenize_in_blocks(
        raw, tokenize, block_size, data_args, training_args, "Running tokenizer on dataset", labels=True
    )
    too_short = f"the {{name}} text gives no full block of {block_size} tokens; lower --block_size or give more text"
    train_dataset, eval_dataset = lm.select_splits(lm_datasets, data_args, training_args, too_short)

    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        # Every block has the same length: no padding to do (the default collator would pad).
        data_collator=default_data_collator,
        **lm.metric_kwargs(model.config, training_args, causal=True),
    )

    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(train_dataset)):
            return

    if training_args.do_eval:
        lm.evaluate(trainer, len(eval_dataset))
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
