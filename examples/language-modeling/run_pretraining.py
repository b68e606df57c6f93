#!/usr/bin/env python
"""Pretrain BERT (masked LM + next sentence prediction, `BertForPreTraining`) with `IPUTrainer`, packed or not; or
GroupBERT (`--model_type groupbert`, `optimum_ipu.models.modeling_groupbert`), unpacked.

Optimum Graphcore's `run_pretraining.py`, with its flags; its recipe (BERT-base phase 1, online):

    python run_pretraining.py --config_name bert-base-uncased --tokenizer_name bert-base-uncased \\
      --ipu_config_name Graphcore/bert-base-ipu --dataset_name Graphcore/wikipedia-bert-128 --do_train \\
      --logging_steps 5 --max_seq_length 128 --max_steps 10500 --is_already_preprocessed \\
      --dataloader_num_workers 64 --dataloader_mode async_rebatched --lamb --lamb_no_bias_correction \\
      --per_device_train_batch_size 32 --gradient_accumulation_steps 512 --n_ipu 16 --learning_rate 0.006 \\
      --lr_scheduler_type linear --loss_scaling 16384 --weight_decay 0.01 --warmup_ratio 0.28 \\
      --config_overrides "layer_norm_eps=0.001" --ipu_config_overrides "device_iterations=1" \\
      --output_dir output-pretrain-bert-base-phase1

The data: sentence pairs with `input_ids`, `token_type_ids` and `next_sentence_label` (a Hub data set such as
`Graphcore/wikipedia-bert-128`, or a folder written by `prepare_dataset.py`: `--dataset_path`), or plain text
(`--train_file` / `--validation_file`, `--dataset_name` of a text data set) made into pairs here as
`prepare_dataset.py` makes them. `--packing` packs the training pairs several to a row (a packed folder of
`prepare_dataset.py --packing` is used as it is): each pair attends to itself only, its positions restart at 0, and
the loss is the MLM cross-entropy over the row's masked tokens plus each pair's NSP cross-entropy at its own [CLS].
`DataCollatorForLanguageModelingWithMaxTokensMasked` masks `--mlm_probability` of the tokens, at most
`max_num_masked_tokens` a row (saved in the model's config, as Optimum Graphcore did). Evaluation pairs are never
packed; `eval_mlm_accuracy` (on the masked tokens) and `eval_nsp_accuracy` are reported with `perplexity =
exp(eval_loss)` (of the MLM + NSP loss).
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import inspect
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from example_utils import language_modeling as lm
from example_utils.pretraining import PAIR_COLUMNS, make_pairs
from torchmetrics.functional import accuracy
from transformers import AutoModelForPreTraining, EvalPrediction, SchedulerType, default_data_collator, set_seed

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.data import DataCollatorForLanguageModelingWithMaxTokensMasked
from optimum_ipu.errors import run_script
from optimum_ipu.models import load_model_modules
from optimum_ipu.packing.pretraining import (
    PackedPretrainingLoss,
    max_num_masked_tokens,
    next_sentence_logits,
    pack_pretraining_pairs,
    packed_pretraining_collator,
)

logger = logging.getLogger(__name__)
PACKED_COLUMNS = ("input_ids", "position_ids", "labels")
load_model_modules()  # --model_type groupbert: the plans' own models known to transformers' auto classes


@dataclass
class ModelArguments(lm.ModelArguments):
    """`run_mlm.py`'s model flags, `--config_overrides` also over a named config or checkpoint (Optimum Graphcore's
    pretraining script applied them so: its BERT recipes pass `--config_name` with `--config_overrides`), and
    `--groupbert_schedule`."""

    groupbert_schedule: bool = field(
        default=False,
        metadata={"help": "Optimum Graphcore's polynomial LR decay to 1e-7 (here with a linear warmup)."},
    )

    def __post_init__(self) -> None:
        overrides, self.config_overrides = self.config_overrides, None  # checked by the parent without them
        super().__post_init__()
        self.config_overrides = overrides


@dataclass
class DataTrainingArguments:
    """Optimum Graphcore's data flags of `run_pretraining.py`, and how pairs are made from text and packed."""

    dataset_name: str | None = field(default=None, metadata={"help": "Dataset id on the Hub (pairs, or text)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    dataset_path: str | None = field(
        default=None, metadata={"help": "A folder saved by Dataset.save_to_disk (prepare_dataset.py's output)."}
    )
    train_file: str | None = field(default=None, metadata={"help": "Training text (.txt/.tokens/.raw)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation text, same formats."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    validation_split_percentage: int = field(
        default=5, metadata={"help": "Percentage of the training pairs evaluated on when there is no validation set."}
    )
    is_already_preprocessed: bool = field(
        default=False, metadata={"help": "The data holds pairs already (input_ids, next_sentence_label)."}
    )
    is_already_masked: bool = field(
        default=False, metadata={"help": "The input ids are masked in the data already (labels given)."}
    )
    max_seq_length: int | None = field(default=None, metadata={"help": "Tokens of a pair (and of a packed row)."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of the tokens masked for the MLM loss."})
    packing: bool = field(default=False, metadata={"help": "Pack the training pairs several to a row."})
    max_sequences_per_pack: int = field(default=3, metadata={"help": "With --packing: at most this many pairs a row."})
    short_seq_prob: float = field(default=0.1, metadata={"help": "Pairs made from text: share with a shorter target."})
    dupe_factor: int = field(default=1, metadata={"help": "Pairs made from text: passes, each with new pairs."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation pairs."})

    def __post_init__(self) -> None:
        if self.dataset_path is None:
            lm.check_data_arguments(self)
        elif not os.path.isdir(self.dataset_path):
            raise FileNotFoundError(
                f"--dataset_path {self.dataset_path}: no such folder (prepare_dataset.py writes one)"
            )
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability {self.mlm_probability}: expected a share in (0, 1), e.g. 0.15")
        if self.max_sequences_per_pack < 1:
            raise ValueError(f"--max_sequences_per_pack {self.max_sequences_per_pack}: expected at least 1, e.g. 3")


def load_data(data_args: Any, model_args: Any) -> datasets.DatasetDict:
    """The splits as stored: a `save_to_disk` folder, a Hub data set or local text files."""
    if data_args.dataset_path is not None:
        try:
            loaded = datasets.load_from_disk(data_args.dataset_path)
        except IndexError:  # datasets saves an empty split without a shard, then cannot load it
            empty = [p.parent.name for p in Path(data_args.dataset_path).glob("*/state.json") if no_shard(p)]
            if not empty:
                raise
            raise ValueError(
                f"--dataset_path {data_args.dataset_path}: its {', '.join(sorted(empty))} split has no rows; give "
                "data with rows"
            ) from None
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    return lm.load_raw_datasets(data_args, model_args)


def no_shard(state_file: Path) -> bool:
    """Whether a saved split's `state.json` lists no data file (a split saved with no rows)."""
    try:
        return not json.loads(state_file.read_text(encoding="utf-8")).get("_data_files", [None])
    except (OSError, ValueError, AttributeError):
        return False


def is_pairs(dataset: datasets.Dataset) -> bool:
    return set(PAIR_COLUMNS) <= set(dataset.column_names) or is_packed(dataset)


def is_packed(dataset: datasets.Dataset) -> bool:
    return set(PACKED_COLUMNS) <= set(dataset.column_names)


def pretraining_data(data_args: Any, model_args: Any, tokenizer: Any, max_seq_length: int, seed: int) -> Any:
    """Pairs (or packed rows) of each split: as stored, or made from text; the training pairs packed with
    `--packing`; a validation split cut from the training pairs when there is none."""
    data = load_data(data_args, model_args)
    for split in list(data):
        if len(data[split]) == 0:  # the split of a text file with no line, or a saved folder's empty split
            raise ValueError(f"{data_source(data_args, split)}: its {split} split has no rows; give data with rows")
        if is_pairs(data[split]):
            continue
        if data_args.is_already_preprocessed:
            raise ValueError(
                f"--is_already_preprocessed: the {split} split has columns {data[split].column_names}, not "
                f"{', '.join(PAIR_COLUMNS)}; leave the flag out to make pairs from its text"
            )
        texts = data[split][lm.text_column(data[split])]
        data[split] = make_pairs(
            texts, tokenizer, max_seq_length, data_args.short_seq_prob, data_args.dupe_factor, seed
        )
    if "validation" not in data and "train" in data and not is_packed(data["train"]):
        parts = data["train"].train_test_split(test_size=data_args.validation_split_percentage / 100, seed=seed)
        data["train"], data["validation"] = parts["train"], parts["test"]
    if "validation" in data and is_packed(data["validation"]):
        raise ValueError("the validation split is packed; evaluation takes unpacked pairs (prepare_dataset.py's)")
    for split, dataset in data.items():
        longest = pc.max(pc.list_value_length(dataset.data.column("input_ids"))).as_py() or 0
        if longest > max_seq_length:
            raise ValueError(
                f"the {split} data has rows of {longest} tokens, more than --max_seq_length {max_seq_length}: "
                f"pass --max_seq_length {longest} or prepare the data with this length"
            )
    if data_args.packing and "train" in data and not is_packed(data["train"]):
        packed = pack_pretraining_pairs(data["train"], max_seq_length, data_args.max_sequences_per_pack)
        logger.info("packing: %d training pairs in %d rows", len(data["train"]), len(packed["input_ids"]))
        data["train"] = datasets.Dataset.from_dict(packed).shuffle(seed=seed)
    return data


def data_source(data_args: Any, split: str) -> str:
    """Where a split's rows come from, as the flag that named them."""
    if data_args.dataset_path is not None:
        return f"--dataset_path {data_args.dataset_path}"
    if data_args.dataset_name is not None:
        return f"--dataset_name {data_args.dataset_name}"
    if split == "validation" and data_args.validation_file is not None:
        return f"--validation_file {data_args.validation_file}"
    return f"--train_file {data_args.train_file}"  # a validation split cut from the training pairs comes from it


def check_pair_values(data: datasets.DatasetDict, data_args: Any, vocab_size: int) -> None:
    """Every token id inside the model's vocabulary and every next-sentence label 0, 1 or -100 (ignored), counted
    over the stored columns with Arrow (no row is read into Python): an id past the embeddings stopped training in
    an IndexError from inside the model, and an NSP label of 2 in one from inside the loss.

    Raises:
        `ValueError`: one line naming the split's source, the column, the value found and the fix.
    """
    for split, dataset in data.items():
        source = f"{data_source(data_args, split)} ({split})"
        ids = pc.list_flatten(dataset.data.column("input_ids"))
        low, high = (pc.min_max(ids)[key].as_py() for key in ("min", "max"))
        if high is not None and (low < 0 or high >= vocab_size):
            bad = high if high >= vocab_size else low
            raise ValueError(
                f"{source}: input_ids holds token id {bad}, outside the model's vocabulary of {vocab_size} "
                "(vocab_size); prepare the data with the model's tokenizer, or give a model of that vocabulary"
            )
        column = "labels" if is_packed(dataset) else "next_sentence_label"
        labels = dataset.data.column(column)
        labels = (
            pc.list_flatten(labels) if pa.types.is_list(labels.type) or pa.types.is_large_list(labels.type) else labels
        )
        found = set(pc.unique(labels).to_pylist()) - {0, 1, -100}
        if found:
            raise ValueError(
                f"{source}: {column} holds {sorted(found, key=str)[:5]}; a next-sentence label is 0 (B follows A), "
                "1 (B is random) or -100 (ignored): prepare the data with prepare_dataset.py"
            )


def preprocess_logits(model: torch.nn.Module) -> Any:
    """`preprocess_logits_for_metrics`: the predicted tokens, and the NSP predictions (of position 0 for unpacked
    rows; of every position as a pair's first token for packed ones)."""

    def preprocess(logits: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = logits[0].argmax(dim=-1)
        if isinstance(labels, torch.Tensor) and labels.dim() == 3:  # packed layout
            with torch.no_grad():
                return tokens, next_sentence_logits(model, logits[2][-1]).argmax(dim=-1)
        return tokens, logits[1].argmax(dim=-1)

    return preprocess


def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """`mlm_accuracy` over the masked tokens and `nsp_accuracy` over the pairs (torchmetrics, micro average)."""
    tokens, nsp = (np.asarray(p) for p in prediction.predictions)
    label_ids = prediction.label_ids
    if isinstance(label_ids, (tuple, list)):  # unpacked: (labels, next_sentence_label)
        mlm_labels, nsp_labels = np.asarray(label_ids[0]), np.asarray(label_ids[1]).reshape(-1)
        nsp = nsp.reshape(-1)
    else:  # packed layout: (batch, seq, 2)
        mlm_labels, nsp_labels = label_ids[..., 0], label_ids[..., 1].reshape(-1)
        nsp = nsp.reshape(-1)
    metrics = {}
    for name, preds, labels in (("mlm", tokens.reshape(-1), mlm_labels.reshape(-1)), ("nsp", nsp, nsp_labels)):
        keep = labels != -100
        if not keep.any():
            metrics[f"{name}_accuracy"] = float("nan")
            continue
        p, t = torch.as_tensor(preds[keep]).long(), torch.as_tensor(labels[keep]).long()
        classes = int(max(p.max(), t.max())) + 1
        metrics[f"{name}_accuracy"] = float(accuracy(p, t, task="multiclass", num_classes=classes, average="micro"))
    return metrics


def data_collator(data_args: Any, model: Any, tokenizer: Any, max_seq_length: int, train: Any) -> Any:
    """The batches' collator: the packed pretraining collator (packed training rows; evaluation pairs as one-pair
    rows), or `DataCollatorForLanguageModelingWithMaxTokensMasked` padding every pair to `max_seq_length`."""
    if data_args.is_already_masked:
        return default_data_collator
    # saved in the model's config as Optimum Graphcore's script did (its BERT gathered that many positions)
    model.config.max_num_masked_tokens = max_num_masked_tokens(max_seq_length, data_args.mlm_probability)
    if train is not None and is_packed(train):
        slots = max(len(labels) for labels in train["labels"])
        return packed_pretraining_collator(model, tokenizer, max_seq_length, slots, data_args.mlm_probability)
    return DataCollatorForLanguageModelingWithMaxTokensMasked(
        max_seq_length,
        tokenizer=tokenizer,
        mlm_probability=data_args.mlm_probability,
        pad_to_multiple_of=max_seq_length,
    )


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    config, tokenizer = lm.load_config_and_tokenizer(model_args)
    if model_args.config_overrides and (model_args.config_name or model_args.model_name_or_path):
        try:
            config.update_from_string(model_args.config_overrides)
        except ValueError as err:
            raise ValueError(f"--config_overrides {model_args.config_overrides!r}: {err}") from None
    if model_args.groupbert_schedule:
        # Optimum Graphcore's schedule decays polynomially (power 1) to 1e-7 after a warmup of power 0.5;
        # transformers' "polynomial" schedule has the same decay after a linear warmup
        logger.warning("--groupbert_schedule: polynomial decay to 1e-7 after a linear warmup (not a square-root one)")
        training_args.lr_scheduler_type = SchedulerType.POLYNOMIAL  # the enum, as parsed (the model card reads .value)
        training_args.lr_scheduler_kwargs = {"lr_end": 1e-7, "power": 1.0}
    if tokenizer.mask_token is None or tokenizer.cls_token is None:
        raise ValueError(f"--tokenizer_name: {type(tokenizer).__name__} has no [MASK]/[CLS]; use a BERT tokenizer")
    model = lm.load_model(AutoModelForPreTraining, model_args, config, tokenizer, training_args)
    if "next_sentence_label" not in inspect.signature(model.forward).parameters:
        raise ValueError(
            f"--model_type/--config_name: {type(model).__name__} has no next-sentence head; BERT pretraining needs "
            "a BertForPreTraining (e.g. --model_type bert)"
        )
    max_seq_length = lm.sequence_length(data_args.max_seq_length, "max_seq_length", tokenizer, model.config)
    data = pretraining_data(data_args, model_args, tokenizer, max_seq_length, training_args.seed)
    check_pair_values(data, data_args, model.config.vocab_size)
    too_short = "the {name} data holds no pair; give more text (documents of two sentences or more)"
    train_dataset, eval_dataset = lm.select_splits(data, data_args, training_args, too_short)
    packed = train_dataset is not None and is_packed(train_dataset)
    if packed:
        training_args.label_names = ["labels"]  # one tensor: MLM labels and each pair's NSP label at its [CLS]
    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator(data_args, model, tokenizer, max_seq_length, train_dataset),
        compute_loss_func=PackedPretrainingLoss(model) if packed else None,
        compute_metrics=compute_metrics if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits(model) if training_args.do_eval else None,
    )
    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(train_dataset)):
            return
    if training_args.do_eval:
        lm.evaluate(trainer, len(eval_dataset))
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
