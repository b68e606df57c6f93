#!/usr/bin/env python
"""Fine-tune a `transformers` model for extractive question answering (SQuAD) with `IPUTrainer`.

The reference recipe of Optimum Graphcore, run from this folder (it reads `./ipu_config.json`):

    python run_qa.py --ipu_config_name=./ --model_name_or_path bert-base-uncased --dataset_name squad \\
      --do_train --do_eval --output_dir output --overwrite_output_dir --per_device_train_batch_size 2 \\
      --per_device_eval_batch_size 2 --learning_rate 6e-5 --num_train_epochs 3 --max_seq_length 384 \\
      --doc_stride 128 --seed 1984 --lr_scheduler_type linear --loss_scaling 64 --weight_decay 0.01 \\
      --warmup_ratio 0.1

Offline, give local files instead of `--dataset_name`: `--train_file` / `--validation_file` take the official
nested SQuAD JSON (split by article with `--train_articles 0:34 --validation_articles 34:40`) or flat JSON/JSONL.
Writes `train_results.json`, `eval_results.json` and `all_results.json` (`eval_exact_match`, `eval_f1`, ...).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from functools import partial

import datasets
import transformers
from trainer_qa import IPUQuestionAnsweringTrainer
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    default_data_collator,
    set_seed,
)
from utils_qa import (
    load_squad_json,
    postprocess_qa_predictions,
    prepare_train_features,
    prepare_validation_features,
    squad_metrics,
    squad_v2_metrics,
)

from optimum_ipu import IPUTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.packing import packed_question_answering_loss, prepare_packed_training

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune."""

    model_name_or_path: str = field(metadata={"help": "Model folder or id in the local Hugging Face cache."})
    config_name: str | None = field(default=None, metadata={"help": "Config folder or id, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer folder or id, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloaded models are cached."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to cut it into features."""

    dataset_name: str | None = field(default=None, metadata={"help": "Dataset name (from the local datasets cache)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "SQuAD JSON (nested or flat) or JSONL file."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation file, same formats."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction file, same formats."})
    train_articles: str | None = field(default=None, metadata={"help": "Articles of a nested train file, e.g. 0:34."})
    validation_articles: str | None = field(default=None, metadata={"help": "Articles of the eval file, e.g. 34:40."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized features."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_seq_length: int = field(default=384, metadata={"help": "Tokens per feature (question + context window)."})
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every feature to max_seq_length (static shapes, one compiled graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep this many prediction examples."})
    version_2_with_negative: bool = field(default=False, metadata={"help": "Some questions have no answer."})
    null_score_diff_threshold: float = field(default=0.0, metadata={"help": "SQuAD v2: threshold for no answer."})
    doc_stride: int = field(default=128, metadata={"help": "Tokens shared by consecutive windows of a context."})
    n_best_size: int = field(default=20, metadata={"help": "Start/end candidates kept per feature."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer, in tokens."})
    packing: bool = field(
        default=False,
        metadata={"help": "Pack several training features into each max_seq_length row (attention kept per feature)."},
    )
    max_sequences_per_pack: int | None = field(default=None, metadata={"help": "At most this many features a row."})

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("give --dataset_name or --train_file/--validation_file (SQuAD JSON, nested or flat)")
        # 0 or negative values gave EM/F1 0.0 silently (n_best_size, max_answer_length) or failed deep inside
        for flag in (
            "max_seq_length",
            "n_best_size",
            "max_answer_length",
            "max_sequences_per_pack",
            "max_train_samples",
            "max_eval_samples",
            "max_predict_samples",
        ):
            value = getattr(self, flag)
            if value is not None and value < 1:
                raise ValueError(f"--{flag} {value}: expected an integer >= 1")
        if not 0 <= self.doc_stride < self.max_seq_length:
            raise ValueError(
                f"--doc_stride {self.doc_stride}: expected 0 <= doc_stride < --max_seq_length ({self.max_seq_length}), "
                "e.g. 128 with 384"
            )


def parse_articles(text: str | None) -> slice | None:
    if not text:
        return None
    start, _, stop = text.partition(":")
    try:
        return slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise ValueError(f"article range {text!r}: expected START:STOP, e.g. 0:34") from None


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation / test examples, from local files or the local `datasets` cache."""
    if data.train_file or data.validation_file or data.test_file:
        files = {
            "train": (data.train_file, data.train_articles),
            "validation": (data.validation_file, data.validation_articles),
            "test": (data.test_file, None),
        }
        return {
            split: load_squad_json(path, parse_articles(articles)) for split, (path, articles) in files.items() if path
        }
    try:
        return dict(datasets.load_dataset(data.dataset_name, data.dataset_config_name, cache_dir=model.cache_dir))
    except Exception as err:  # offline: DatasetNotFoundError, ConnectionError, OfflineModeIsEnabled, ...
        raise SystemExit(
            f"--dataset_name {data.dataset_name}: not in the local datasets cache and the Hub cannot be reached "
            f"({type(err).__name__}). Pass local files instead, e.g. --train_file "
            "../../../shared/data/squad/squad-v1.1-dev-articles-00-39.json --train_articles 0:34 --validation_file "
            "(same file) --validation_articles 34:40"
        ) from None


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

    hub = {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path, **hub)
    if not tokenizer.is_fast:
        raise ValueError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; this script needs offset mappings. Use a model "
            "with a tokenizer.json (the `tokenizers` library), see https://huggingface.co/transformers/index.html"
        )
    model = AutoModelForQuestionAnswering.from_pretrained(model_args.model_name_or_path, config=config, **hub)

    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    if data_args.max_seq_length > tokenizer.model_max_length:
        logger.warning("max_seq_length %d > the model's %d: using the latter", data_args.max_seq_length, max_seq_length)
    features_kwargs = {
        "tokenizer": tokenizer,
        "max_seq_length": max_seq_length,
        "doc_stride": data_args.doc_stride,
        "pad_to_max_length": data_args.pad_to_max_length,
    }

    def tokenize(
        split: str, fn, limit: int | None, description: str, pad: bool | None = None
    ) -> tuple[datasets.Dataset, datasets.Dataset]:
        if split not in raw:
            raise ValueError(f"--do_{'train' if split == 'train' else 'eval'} needs a {split} dataset")
        examples = raw[split]
        if limit is not None:
            examples = examples.select(range(min(limit, len(examples))))
        if len(examples) == 0:  # found before training, not after it and the save
            raise ValueError(
                f"--do_{'train' if split == 'train' else 'eval'}: the {split} set is empty; check the file, its "
                "--*_articles range and --max_*_samples"
            )
        with training_args.main_process_first(desc=description):
            features = examples.map(
                partial(
                    fn,
                    **{
                        **features_kwargs,
                        "pad_to_max_length": features_kwargs["pad_to_max_length"] if pad is None else pad,
                    },
                ),
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=examples.column_names,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=description,
            )
        return examples, features

    train_dataset = eval_examples = eval_dataset = predict_examples = predict_dataset = None
    if training_args.do_train:
        # packed rows are built from unpadded features
        pad = False if data_args.packing else None
        _, train_dataset = tokenize("train", prepare_train_features, data_args.max_train_samples, "train features", pad)
        if data_args.max_train_samples is not None:  # one example can give several features
            train_dataset = train_dataset.select(range(min(data_args.max_train_samples, len(train_dataset))))
    if training_args.do_eval:
        eval_examples, eval_dataset = tokenize(
            "validation", prepare_validation_features, data_args.max_eval_samples, "validation features"
        )
    if training_args.do_predict:
        predict_examples, predict_dataset = tokenize(
            "test", prepare_validation_features, data_args.max_predict_samples, "prediction features"
        )

    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    trainer_kwargs = {}
    train_features = len(train_dataset) if train_dataset is not None else 0
    if data_args.packing and train_dataset is not None:
        # a dense block-diagonal mask for eager/sdpa attention, sequence ids (a BlockMask on the device) for flex
        packing = prepare_packed_training(
            model,
            train_dataset,
            max_seq_length,
            tokenizer.pad_token_id,
            collator,
            packed_question_answering_loss,
            data_args.max_sequences_per_pack,
        )
        train_dataset, collator = packing.train_dataset, packing.data_collator
        # one `labels` tensor of per-sequence slots, read by the packed loss (the model gets no labels)
        training_args.label_names = ["labels"]
        trainer_kwargs["compute_loss_func"] = packing.compute_loss_func

    def post_process(examples, features, predictions, prefix: str = "eval") -> dict[str, str]:
        return postprocess_qa_predictions(
            examples=examples,
            features=features,
            predictions=predictions,
            version_2_with_negative=data_args.version_2_with_negative,
            n_best_size=data_args.n_best_size,
            max_answer_length=data_args.max_answer_length,
            null_score_diff_threshold=data_args.null_score_diff_threshold,
            output_dir=training_args.output_dir if training_args.should_save else None,
            prefix=prefix,
        )

    trainer = IPUQuestionAnsweringTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        eval_examples=eval_examples,
        processing_class=tokenizer,
        data_collator=collator,
        post_process_function=post_process,
        compute_metrics=squad_v2_metrics if data_args.version_2_with_negative else squad_metrics,
        **trainer_kwargs,
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        if training_args.compile_only:
            logger.info("--compile_only: graphs compiled and cached; nothing trained or saved")
            return
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        if data_args.packing:  # samples are packed rows; SQuAD features per second is the comparable figure
            metrics["train_features"] = train_features
            metrics["train_features_per_second"] = round(
                metrics["train_samples_per_second"] * train_features / len(train_dataset), 3
            )
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        results = trainer.predict(predict_dataset, predict_examples)
        results.metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", results.metrics)
        trainer.save_metrics("predict", results.metrics)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
