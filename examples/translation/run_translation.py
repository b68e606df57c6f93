#!/usr/bin/env python
"""Fine-tune a sequence-to-sequence model (T5, ...) for translation with `IPUSeq2SeqTrainer`, scored by sacreBLEU.

The flags of the `transformers` example of the same name, plus `--ipu_config_name`. From this folder (it reads
`./ipu_config.json`), T5 on WMT16 English-Romanian:

    python run_translation.py --ipu_config_name=./ --model_name_or_path t5-small --do_train --do_eval \\
      --source_lang en --target_lang ro --source_prefix "translate English to Romanian: " \\
      --dataset_name wmt16 --dataset_config_name ro-en --output_dir output --overwrite_output_dir \\
      --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --pad_to_max_length \\
      --max_source_length 128 --max_target_length 128 --predict_with_generate

Data: `--dataset_name` (from the local `datasets` cache), or for each of `--train_file`, `--validation_file` and
`--test_file` either JSON lines in the Hugging Face layout, `{"translation": {"en": "...", "ro": "..."}}` (`.json` or
`.jsonl`), or a pair of aligned plain-text files (one sentence a line, optionally gzipped) named by their common
prefix: `--train_file data/newsdev2016-enro` reads `data/newsdev2016-enro.en[.gz]` and
`data/newsdev2016-enro.ro[.gz]` (the WMT/Moses layout, languages from `--source_lang` / `--target_lang`).
Writes `train_results.json`, `eval_results.json` (`eval_bleu`, `eval_gen_len`, ...), `all_results.json` and, with
`--do_predict --predict_with_generate`, `generated_predictions.txt`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import sacrebleu
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    default_data_collator,
    set_seed,
)

from optimum_ipu import IPUSeq2SeqTrainer, IPUSeq2SeqTrainingArguments
from optimum_ipu.errors import run_script

logger = logging.getLogger(__name__)

T5_CHECKPOINTS = ("t5-small", "t5-base", "t5-large", "t5-3b", "t5-11b", "google-t5/t5-small", "google-t5/t5-base")


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune."""

    model_name_or_path: str = field(metadata={"help": "Model folder or id in the local Hugging Face cache."})
    config_name: str | None = field(default=None, metadata={"help": "Config folder or id, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer folder or id, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloaded models are cached."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (tokenizers) tokenizer."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize it."""

    source_lang: str | None = field(default=None, metadata={"help": "Source language id, e.g. en."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language id, e.g. ro."})
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset name (from the local datasets cache)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration, e.g. ro-en."})
    train_file: str | None = field(
        default=None, metadata={"help": "JSON lines {'translation': {...}}, or the prefix of aligned files."}
    )
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
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("give --dataset_name or --train_file/--validation_file (JSON lines or aligned files)")
        if self.source_lang is None or self.target_lang is None:
            raise ValueError("give --source_lang and --target_lang, e.g. --source_lang en --target_lang ro")
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _language_file(prefix: str, lang: str) -> Path | None:
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.is_file():
            return candidate
    return None


def load_translation_file(path: str, source_lang: str, target_lang: str) -> datasets.Dataset:
    """Examples `{"translation": {source_lang: ..., target_lang: ...}}` from JSON lines or aligned files.

    Args:
        path: a `.json` / `.jsonl` file of JSON lines in the Hugging Face layout, or the common prefix of two
            aligned text files `{path}.{source_lang}[.gz]` and `{path}.{target_lang}[.gz]`.
    """
    if os.path.isfile(path):
        if not path.endswith((".json", ".jsonl")):
            raise ValueError(
                f"{path}: expected JSON lines (.json or .jsonl) with a 'translation' field, or the prefix of aligned "
                f"files {Path(path).name}.{source_lang}[.gz] / .{target_lang}[.gz]"
            )
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for number, row in enumerate(rows, 1):
            pair = row.get("translation") if isinstance(row, dict) else None
            if not isinstance(pair, dict) or source_lang not in pair or target_lang not in pair:
                raise ValueError(
                    f"{path}, line {number}: expected {{'translation': {{'{source_lang}': ..., '{target_lang}': ...}}}}"
                    f"; got keys {sorted(pair) if isinstance(pair, dict) else sorted(row)}"
                )
        return datasets.Dataset.from_list([{"translation": row["translation"]} for row in rows])
    source, target = _language_file(path, source_lang), _language_file(path, target_lang)
    if source is None or target is None:
        raise FileNotFoundError(
            f"{path}: neither a file nor the prefix of aligned files {path}.{source_lang}[.gz] and "
            f"{path}.{target_lang}[.gz]"
        )
    sources, targets = _read_lines(source), _read_lines(target)
    if len(sources) != len(targets):
        raise ValueError(f"{source} has {len(sources)} lines but {target} has {len(targets)}: they must be aligned")
    return datasets.Dataset.from_dict(
        {"translation": [{source_lang: s, target_lang: t} for s, t in zip(sources, targets, strict=True)]}
    )


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation / test examples, from local files or the local `datasets` cache."""
    files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}
    if any(files.values()):
        return {
            split: load_translation_file(path, data.source_lang, data.target_lang)
            for split, path in files.items()
            if path
        }
    try:
        return dict(datasets.load_dataset(data.dataset_name, data.dataset_config_name, cache_dir=model.cache_dir))
    except Exception as err:  # offline: DatasetNotFoundError, ConnectionError, OfflineModeIsEnabled, ...
        raise SystemExit(
            f"--dataset_name {data.dataset_name}: not in the local datasets cache and the Hub cannot be reached "
            f"({type(err).__name__}). Pass local files instead, e.g. --train_file "
            "../../../shared/data/wmt16_en_ro/newsdev2016-enro --validation_file "
            "../../../shared/data/wmt16_en_ro/newstest2016-enro (aligned .en.gz/.ro.gz files)"
        ) from None


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, IPUSeq2SeqTrainingArguments))
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

    if data_args.source_prefix is None and model_args.model_name_or_path in T5_CHECKPOINTS:
        logger.warning(
            "You're running a t5 model but didn't provide a source prefix, which is expected, e.g. with "
            "`--source_prefix 'translate English to Romanian: '`"
        )

    # A non-empty output_dir is resumed from its last checkpoint, or refused without --overwrite_output_dir.
    last_checkpoint = training_args.checkpoint_in_output_dir()

    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)

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
    model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, config=config, **hub)
    # resize only when needed: a larger embedding than the vocabulary is fine, a smaller one breaks lookups
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    if model.config.decoder_start_token_id is None:
        raise ValueError("the model config has no decoder_start_token_id; set it (T5: the pad token id, 0)")
    if data_args.forced_bos_token is not None:
        model.config.forced_bos_token_id = tokenizer.convert_tokens_to_ids(data_args.forced_bos_token)

    prefix = data_args.source_prefix or ""
    source_lang, target_lang = data_args.source_lang.split("_")[0], data_args.target_lang.split("_")[0]
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess(examples: dict[str, list], max_target_length: int) -> dict[str, list]:
        inputs = [prefix + pair[source_lang] for pair in examples["translation"]]
        targets = [pair[target_lang] for pair in examples["translation"]]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, padding=padding, truncation=True)
        labels = tokenizer(text_target=targets, max_length=max_target_length, padding=padding, truncation=True)
        if padding == "max_length" and data_args.ignore_pad_token_for_loss:
            # padded label positions get -100: no loss on them
            pad = tokenizer.pad_token_id
            labels["input_ids"] = [[(t if t != pad else -100) for t in label] for label in labels["input_ids"]]
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    def tokenize(split: str, limit: int | None, max_target_length: int) -> datasets.Dataset:
        if split not in raw:
            flag = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}[split]
            raise ValueError(f"{flag} needs a {split} dataset")
        dataset = raw[split]
        if limit is not None:
            dataset = dataset.select(range(min(limit, len(dataset))))
        with training_args.main_process_first(desc=f"{split} dataset map pre-processing"):
            return dataset.map(
                preprocess,
                fn_kwargs={"max_target_length": max_target_length},
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=dataset.column_names,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Running tokenizer on {split} dataset",
            )

    train_dataset = eval_dataset = predict_dataset = None
    if training_args.do_train:
        train_dataset = tokenize("train", data_args.max_train_samples, data_args.max_target_length)
    if training_args.do_eval:
        eval_dataset = tokenize("validation", data_args.max_eval_samples, data_args.val_max_target_length)
    if training_args.do_predict:
        predict_dataset = tokenize("test", data_args.max_predict_samples, data_args.val_max_target_length)

    label_pad_token_id = -100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id
    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorForSeq2Seq(
            tokenizer,
            model=model,
            label_pad_token_id=label_pad_token_id,
            pad_to_multiple_of=8 if training_args.fp16 else None,
        )
    # generation at static shapes: every prompt padded to the source length
    if training_args.generation_prompt_length is None:
        training_args.generation_prompt_length = data_args.max_source_length

    def compute_metrics(prediction: transformers.EvalPrediction) -> dict[str, float]:
        preds, labels = prediction.predictions, prediction.label_ids
        if isinstance(preds, tuple):
            preds = preds[0]
        # -100 marks padding (between batches, and ignored labels): it cannot be decoded
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_preds = [text.strip() for text in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        decoded_labels = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        result = {"bleu": sacrebleu.corpus_bleu(decoded_preds, [decoded_labels]).score}
        result["gen_len"] = float(np.mean([np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds]))
        return {key: round(value, 4) for key, value in result.items()}

    trainer = IPUSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        if training_args.compile_only:
            logger.info("--compile_only: graphs compiled and cached; nothing trained or saved")
            return
        trainer.save_model()  # the tokenizer too
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    max_length = training_args.generation_max_length or data_args.val_max_target_length
    num_beams = data_args.num_beams if data_args.num_beams is not None else training_args.generation_num_beams
    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(max_length=max_length, num_beams=num_beams, metric_key_prefix="eval")
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        results = trainer.predict(
            predict_dataset, metric_key_prefix="predict", max_length=max_length, num_beams=num_beams
        )
        metrics = results.metrics
        metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            ids = np.where(results.predictions != -100, results.predictions, tokenizer.pad_token_id)
            predictions = tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)
            path = os.path.join(training_args.output_dir, "generated_predictions.txt")
            with open(path, "w", encoding="utf-8") as writer:
                writer.write("\n".join(prediction.strip() for prediction in predictions))


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
