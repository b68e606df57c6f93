#!/usr/bin/env python
"""Fine-tune a sequence-to-sequence model (T5, ...) for summarization with `IPUSeq2SeqTrainer`, scored by ROUGE.

The flags of the `transformers` example of the same name, plus `--ipu_config_name`. From this folder (it reads
`./ipu_config.json`), T5 on XSum:

    python run_summarization.py --ipu_config_name=./ --model_name_or_path t5-small --do_train --do_eval \\
      --dataset_name xsum --source_prefix "summarize: " --output_dir output --overwrite_output_dir \\
      --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --pad_to_max_length \\
      --max_source_length 512 --max_target_length 64 --predict_with_generate

Data: `--dataset_name` (from the local `datasets` cache), or `--train_file` / `--validation_file` / `--test_file` in
CSV or JSON lines (`{"document": ..., "summary": ...}` for XSum; the columns are `--text_column` and
`--summary_column`, by default the dataset's known pair or the first two columns).
ROUGE comes from `torchmetrics` (`ROUGEScore`, F-measures x 100 as in the `transformers` example): `rouge1`,
`rouge2` and `rougeL`, plus `rougeLsum` and Porter stemming when `nltk` and its `punkt_tab` data are installed
(the sentence splitter rougeLsum needs; they cannot be downloaded offline). Writes `train_results.json`,
`eval_results.json` (`eval_rouge1`, ..., `eval_gen_len`), `all_results.json` and, with
`--do_predict --predict_with_generate`, `generated_predictions.txt`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from dataclasses import dataclass, field

import datasets
import numpy as np
import transformers
from torchmetrics.text.rouge import ROUGEScore
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

# (text column, summary column) of known data sets, as in the transformers example
summarization_name_mapping = {
    "amazon_reviews_multi": ("review_body", "review_title"),
    "big_patent": ("description", "abstract"),
    "cnn_dailymail": ("article", "highlights"),
    "orange_sum": ("text", "summary"),
    "pn_summary": ("article", "summary"),
    "psc": ("extract_text", "summary_text"),
    "samsum": ("dialogue", "summary"),
    "thaisum": ("body", "summary"),
    "xglue": ("news_body", "news_title"),
    "xsum": ("document", "summary"),
    "wiki_summary": ("article", "highlights"),
    "multi_news": ("document", "summary"),
}


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

    lang: str | None = field(default=None, metadata={"help": "Language id (multilingual tokenizers)."})
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset name (from the local datasets cache)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    text_column: str | None = field(default=None, metadata={"help": "Column of the full texts."})
    summary_column: str | None = field(default=None, metadata={"help": "Column of the summaries."})
    train_file: str | None = field(default=None, metadata={"help": "Training data (CSV or JSON lines)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data (CSV or JSON lines)."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data (CSV or JSON lines)."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_source_length: int = field(default=1024, metadata={"help": "Source tokens kept (and padded to)."})
    max_target_length: int = field(default=128, metadata={"help": "Summary tokens kept in training."})
    val_max_target_length: int | None = field(
        default=None,
        metadata={
            "help": "Summary tokens kept in evaluation, and generate()'s max_length (default max_target_length)."
        },
    )
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every example to the maximum lengths (static shapes, one graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep this many prediction examples."})
    num_beams: int | None = field(default=1, metadata={"help": "Beams of generate() in evaluate and predict."})
    ignore_pad_token_for_loss: bool = field(default=True, metadata={"help": "Padded label tokens get no loss."})
    source_prefix: str | None = field(default=None, metadata={"help": "Text put before every source (T5: summarize)."})
    forced_bos_token: str | None = field(
        default=None, metadata={"help": "Token forced first after the decoder start (multilingual models)."}
    )

    def __post_init__(self) -> None:
        files = (self.train_file, self.validation_file, self.test_file)
        if self.dataset_name is None and not any(files):
            raise ValueError("give --dataset_name or --train_file/--validation_file/--test_file (CSV or JSON lines)")
        for flag, path in zip(("--train_file", "--validation_file", "--test_file"), files, strict=True):
            if path is not None and not path.endswith((".csv", ".json", ".jsonl")):
                raise ValueError(f"{flag} {path}: expected a .csv, .json or .jsonl file")
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation / test examples, from local files or the local `datasets` cache."""
    files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}
    if any(files.values()):
        loaded = {}
        for split, path in files.items():
            if path:
                kind = "csv" if path.endswith(".csv") else "json"
                loaded[split] = datasets.load_dataset(kind, data_files={split: path}, cache_dir=model.cache_dir)[split]
        return loaded
    try:
        return dict(datasets.load_dataset(data.dataset_name, data.dataset_config_name, cache_dir=model.cache_dir))
    except Exception as err:  # offline: DatasetNotFoundError, ConnectionError, OfflineModeIsEnabled, ...
        raise SystemExit(
            f"--dataset_name {data.dataset_name}: not in the local datasets cache and the Hub cannot be reached "
            f"({type(err).__name__}). Pass local files instead, e.g. --train_file "
            "../../../shared/data/fixtures/xsum/sample.json --validation_file (the same file)"
        ) from None


def rouge_metric() -> tuple[ROUGEScore, tuple[str, ...]]:
    """torchmetrics' ROUGE with the keys this machine can compute: rougeLsum and stemming need `nltk` (+ punkt)."""
    keys: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")
    stemmer = importlib.util.find_spec("nltk") is not None
    if stemmer:
        import nltk

        try:
            nltk.data.find("tokenizers/punkt_tab")
            keys += ("rougeLsum",)
        except LookupError:
            pass
    if "rougeLsum" not in keys:
        logger.warning("rougeLsum left out: it needs nltk's punkt_tab sentence splitter, which is not installed")
    return ROUGEScore(use_stemmer=stemmer, rouge_keys=keys), keys


def pick_column(given: str | None, default: str, columns: list[str], flag: str) -> str:
    name = given or default
    if name not in columns:
        raise ValueError(f"{flag} '{name}' needs to be one of: {', '.join(columns)}")
    return name


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
            "`--source_prefix 'summarize: '`"
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
    if data_args.lang is not None and hasattr(tokenizer, "src_lang"):
        tokenizer.src_lang = tokenizer.tgt_lang = data_args.lang
    if data_args.forced_bos_token is not None:
        model.config.forced_bos_token_id = tokenizer.convert_tokens_to_ids(data_args.forced_bos_token)

    splits = [
        s
        for s, wanted in (
            ("train", training_args.do_train),
            ("validation", training_args.do_eval),
            ("test", training_args.do_predict),
        )
        if wanted
    ]
    if not splits:
        logger.info("There is nothing to do: pass --do_train, --do_eval and/or --do_predict")
        return
    for split in splits:
        if split not in raw:
            flag = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}[split]
            raise ValueError(f"{flag} needs a {split} dataset")
    column_names = raw[splits[0]].column_names
    known = summarization_name_mapping.get(data_args.dataset_name or "")
    defaults = known or (column_names[0], column_names[1] if len(column_names) > 1 else column_names[0])
    text_column = pick_column(data_args.text_column, defaults[0], column_names, "--text_column")
    summary_column = pick_column(data_args.summary_column, defaults[1], column_names, "--summary_column")

    prefix = data_args.source_prefix or ""
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess(examples: dict[str, list], max_target_length: int) -> dict[str, list]:
        # pairs with a missing text or summary are dropped
        pairs = [(t, s) for t, s in zip(examples[text_column], examples[summary_column], strict=True) if t and s]
        inputs = [prefix + text for text, _ in pairs]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, padding=padding, truncation=True)
        labels = tokenizer(
            text_target=[s for _, s in pairs], max_length=max_target_length, padding=padding, truncation=True
        )
        if padding == "max_length" and data_args.ignore_pad_token_for_loss:
            # padded label positions get -100: no loss on them
            pad = tokenizer.pad_token_id
            labels["input_ids"] = [[(t if t != pad else -100) for t in label] for label in labels["input_ids"]]
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    def tokenize(split: str, limit: int | None, max_target_length: int) -> datasets.Dataset:
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

    rouge, rouge_keys = rouge_metric()

    def compute_metrics(prediction: transformers.EvalPrediction) -> dict[str, float]:
        preds, labels = prediction.predictions, prediction.label_ids
        if isinstance(preds, tuple):
            preds = preds[0]
        # -100 marks padding (between batches, and ignored labels): it cannot be decoded
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_preds = [text.strip() for text in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        decoded_labels = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        rouge.reset()
        scores = rouge(decoded_preds, decoded_labels)
        result = {key: float(scores[f"{key}_fmeasure"]) * 100 for key in rouge_keys}
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
