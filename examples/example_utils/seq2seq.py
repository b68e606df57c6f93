"""The sequence-to-sequence core that `run_translation.py` and `run_summarization.py` share: data arguments, model and
tokenizer set-up, tokenization of (source, target) pairs, generation settings, decoding for the metric, and the
train / evaluate / predict run with `IPUSeq2SeqTrainer`. Each script keeps what is its own: how it reads its files,
which texts make a pair, and its metric (sacreBLEU, ROUGE).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    default_data_collator,
)

import example_utils
from optimum_ipu import IPUSeq2SeqTrainer

logger = logging.getLogger(__name__)

T5_CHECKPOINTS = ("t5-small", "t5-base", "t5-large", "t5-3b", "t5-11b", "google-t5/t5-small", "google-t5/t5-base")

# (sources, targets) of a batch of raw examples
PairsFn = Callable[[dict[str, list]], tuple[list[str], list[str]]]
# decoded predictions and references -> the metric's scores
ScoreFn = Callable[[list[str], list[str]], dict[str, float]]


@dataclass
class Seq2SeqDataArguments:
    """What data to train and evaluate on, and how to tokenize it (the flags of both upstream scripts)."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hugging Face Hub, or a local dataset folder."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Training data (local file)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same formats."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data, same formats."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_source_length: int = field(default=1024, metadata={"help": "Source tokens kept (and padded to)."})
    max_target_length: int = field(default=128, metadata={"help": "Target tokens kept in training."})
    val_max_target_length: int | None = field(
        default=None,
        metadata={"help": "Target tokens kept in evaluation, and generate()'s max_length (default max_target_length)."},
    )
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every example to the maximum lengths (static shapes, one graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep this many prediction examples."})
    num_beams: int | None = field(default=None, metadata={"help": "Beams of generate() in evaluate and predict."})
    ignore_pad_token_for_loss: bool = field(default=True, metadata={"help": "Padded label tokens get no loss."})
    source_prefix: str | None = field(default=None, metadata={"help": "Text put before every source (T5 tasks)."})
    forced_bos_token: str | None = field(
        default=None, metadata={"help": "Token forced first after the decoder start (multilingual models)."}
    )

    def __post_init__(self) -> None:
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length


def warn_missing_t5_prefix(model_args: Any, data_args: Seq2SeqDataArguments, example: str) -> None:
    """The upstream warning: T5 checkpoints expect a task prefix such as `example`."""
    if data_args.source_prefix is None and model_args.model_name_or_path in T5_CHECKPOINTS:
        logger.warning(
            "You're running a t5 model but didn't provide a source prefix, which is expected, e.g. with "
            f"`--source_prefix '{example}'`"
        )


def wanted_splits(raw: dict[str, datasets.Dataset], training_args: Any) -> list[str]:
    """The splits the run needs (train / validation / test), each checked to be there."""
    splits = example_utils.requested_splits(training_args)
    for split in splits:
        if split not in raw:
            raise ValueError(f"--{example_utils.SPLIT_FLAGS[split]} needs a {split} dataset")
    return splits


def load_model_and_tokenizer(model_args: Any, data_args: Seq2SeqDataArguments, training_args: Any) -> tuple[Any, Any]:
    """`AutoModelForSeq2SeqLM` and its tokenizer, the embeddings grown to the vocabulary when it is larger."""
    hub = example_utils.hub_kwargs(model_args)
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer, **hub
    )
    model = example_utils.load_pretrained(
        AutoModelForSeq2SeqLM, model_args.model_name_or_path, training_args, len(tokenizer), config=config, **hub
    )
    example_utils.grow_embeddings(model, tokenizer)
    if model.config.decoder_start_token_id is None:
        raise ValueError("the model config has no decoder_start_token_id; set it (T5: the pad token id, 0)")
    lang = getattr(data_args, "lang", None)  # multilingual tokenizers (summarization's --lang)
    if lang is not None and hasattr(tokenizer, "src_lang"):
        tokenizer.src_lang = tokenizer.tgt_lang = lang
    if data_args.forced_bos_token is not None:
        model.config.forced_bos_token_id = tokenizer.convert_tokens_to_ids(data_args.forced_bos_token)
    return model, tokenizer


def tokenize_splits(
    raw: dict[str, datasets.Dataset],
    splits: list[str],
    pairs: PairsFn,
    tokenizer: Any,
    data_args: Seq2SeqDataArguments,
    training_args: Any,
) -> dict[str, datasets.Dataset]:
    """Each wanted split as model inputs with `labels`: sources prefixed, padded target positions at -100."""
    prefix = data_args.source_prefix or ""
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess(examples: dict[str, list], max_target_length: int) -> dict[str, list]:
        sources, targets = pairs(examples)
        inputs = [prefix + text for text in sources]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, padding=padding, truncation=True)
        labels = tokenizer(text_target=targets, max_length=max_target_length, padding=padding, truncation=True)
        if padding == "max_length" and data_args.ignore_pad_token_for_loss:
            pad = tokenizer.pad_token_id  # padded label positions get -100: no loss on them
            labels["input_ids"] = [[(t if t != pad else -100) for t in label] for label in labels["input_ids"]]
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
    limits["test"] = data_args.max_predict_samples
    tokenized = {}
    for split in splits:
        dataset = raw[split]
        if limits[split] is not None:
            dataset = dataset.select(range(min(limits[split], len(dataset))))
        target_length = data_args.max_target_length if split == "train" else data_args.val_max_target_length
        with training_args.main_process_first(desc=f"{split} dataset map pre-processing"):
            tokenized[split] = dataset.map(
                preprocess,
                fn_kwargs={"max_target_length": target_length},
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=dataset.column_names,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Running tokenizer on {split} dataset",
            )
    return tokenized


def metric_function(tokenizer: Any, score: ScoreFn) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics` for generated ids: decoded, stripped, scored, with `gen_len`, rounded as upstream."""

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        preds, labels = prediction.predictions, prediction.label_ids
        if isinstance(preds, tuple):
            preds = preds[0]
        # -100 marks padding (between batches, and ignored labels): it cannot be decoded
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_preds = [text.strip() for text in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        decoded_labels = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        result = dict(score(decoded_preds, decoded_labels))
        result["gen_len"] = float(np.mean([np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds]))
        return {key: round(value, 4) for key, value in result.items()}

    return compute_metrics


def build_trainer(
    model: Any,
    tokenizer: Any,
    tokenized: dict[str, datasets.Dataset],
    score: ScoreFn,
    data_args: Seq2SeqDataArguments,
    training_args: Any,
) -> IPUSeq2SeqTrainer:
    """`IPUSeq2SeqTrainer` with the collator of the padding mode and generation at static prompt shapes."""
    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorForSeq2Seq(
            tokenizer,
            model=model,
            label_pad_token_id=-100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id,
            pad_to_multiple_of=8 if training_args.fp16 else None,
        )
    if training_args.generation_prompt_length is None:  # every prompt padded to the source length
        training_args.generation_prompt_length = data_args.max_source_length
    return IPUSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized.get("train"),
        eval_dataset=tokenized.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=metric_function(tokenizer, score) if training_args.predict_with_generate else None,
    )


def write_generated_predictions(trainer: IPUSeq2SeqTrainer, tokenizer: Any, predictions: np.ndarray) -> None:
    """`generated_predictions.txt`: one decoded prediction a line (main process)."""
    if not trainer.is_world_process_zero():
        return
    ids = np.where(predictions != -100, predictions, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)
    path = os.path.join(trainer.args.output_dir, "generated_predictions.txt")
    with open(path, "w", encoding="utf-8") as writer:
        writer.write("\n".join(text.strip() for text in texts))


def run(
    model_args: Any,
    data_args: Seq2SeqDataArguments,
    training_args: Any,
    raw: dict[str, datasets.Dataset],
    pairs: PairsFn,
    score: ScoreFn,
    last_checkpoint: str | None,
) -> None:
    """
    Fine-tunes, evaluates and predicts as the upstream scripts do, on `(source, target)` pairs of `raw`.

    Args:
        model_args: The script's model arguments ([`example_utils.ModelArguments`]).
        data_args ([`Seq2SeqDataArguments`]): The data arguments (or the script's subclass).
        training_args (`IPUSeq2SeqTrainingArguments`): The training arguments.
        raw (`dict[str, datasets.Dataset]`): The raw splits (`train`, `validation`, `test`).
        pairs (`Callable`): A batch of raw examples -> `(sources, targets)`.
        score (`Callable`): Decoded predictions and references -> the metric's scores (`bleu`, `rouge1`, ...).
        last_checkpoint (`str`, *optional*): Resumed from, as [`example_utils.start_run`] found it.
    """
    splits = wanted_splits(raw, training_args)
    if not splits:
        logger.info("There is nothing to do: pass --do_train, --do_eval and/or --do_predict")
        return
    model, tokenizer = load_model_and_tokenizer(model_args, data_args, training_args)
    tokenized = tokenize_splits(raw, splits, pairs, tokenizer, data_args, training_args)
    trainer = build_trainer(model, tokenizer, tokenized, score, data_args, training_args)
    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(tokenized["train"])):
            return
    generation = {
        "max_length": training_args.generation_max_length or data_args.val_max_target_length,
        "num_beams": data_args.num_beams if data_args.num_beams is not None else training_args.generation_num_beams,
    }
    if training_args.do_eval:
        example_utils.evaluate(trainer, len(tokenized["validation"]), metric_key_prefix="eval", **generation)
    if training_args.do_predict:
        test = tokenized["test"]
        results = example_utils.predict(trainer, test, len(test), metric_key_prefix="predict", **generation)
        if training_args.predict_with_generate:
            write_generated_predictions(trainer, tokenizer, results.predictions)
    example_utils.finish(trainer, training_args, model_args, data_args)
