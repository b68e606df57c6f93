#!/usr/bin/env python
"""Fine-tune a `transformers` model for extractive question answering (SQuAD) with `IPUTrainer`.

The reference recipe of Optimum Graphcore, run from this folder (it reads `./ipu_config.json`):

    python run_qa.py --ipu_config_name=./ --model_name_or_path bert-base-uncased --dataset_name squad \\
      --do_train --do_eval --output_dir output --overwrite_output_dir --per_device_train_batch_size 2 \\
      --per_device_eval_batch_size 2 --learning_rate 6e-5 --num_train_epochs 3 --max_seq_length 384 \\
      --doc_stride 128 --seed 1984 --lr_scheduler_type linear --loss_scaling 64 --weight_decay 0.01 \\
      --warmup_ratio 0.1

`--dataset_name` is downloaded from the Hugging Face Hub once, then read from the local `datasets` cache (a local
dataset folder works too). Without a network, give local files instead: `--train_file` / `--validation_file` take
the official nested SQuAD JSON (split by article with `--train_articles 0:34 --validation_articles 34:40`) or flat
JSON/JSONL. Writes `train_results.json`, `eval_results.json` and `all_results.json` (`eval_exact_match`, `eval_f1`;
with `--version_2_with_negative` the official SQuAD v2 keys: `eval_exact`, `eval_f1`, `eval_HasAns_exact`, ...,
`eval_best_f1_thresh`) and, after training, `training_curves.png`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import datasets
from example_utils.peft import PeftArguments, maybe_wrap_with_lora
from trainer_qa import IPUQuestionAnsweringTrainer
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    DataCollatorWithPadding,
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

LOCAL_FILES_HINT = (
    "--train_file squad.json --train_articles 0:34 --validation_file squad.json --validation_articles 34:40 "
    "(SQuAD's nested JSON, e.g. its dev-v1.1.json, or flat JSON lines)"
)


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to cut it into features."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hugging Face Hub (e.g. squad), or a local dataset folder."}
    )
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
        sizes = ("max_seq_length", "n_best_size", "max_answer_length", "max_sequences_per_pack")
        example_utils.check_at_least_one(self, (*sizes, "max_train_samples", "max_eval_samples", "max_predict_samples"))
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


def load_raw_datasets(data: DataTrainingArguments, model: example_utils.ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation / test examples, from local files or the Hugging Face Hub (or its local cache)."""
    if data.train_file or data.validation_file or data.test_file:
        files = {
            "train": (data.train_file, data.train_articles),
            "validation": (data.validation_file, data.validation_articles),
            "test": (data.test_file, None),
        }
        example_utils.require_files({split: path for split, (path, _) in files.items()})
        return {
            split: load_squad_json(path, parse_articles(articles)) for split, (path, articles) in files.items() if path
        }
    raw = example_utils.load_hub_dataset(
        data.dataset_name,
        data.dataset_config_name,
        local_files_hint=LOCAL_FILES_HINT,
        cache_dir=model.cache_dir,
        token=model.token,
    )
    return dict(raw)


def load_model_and_tokenizer(
    model_args: example_utils.ModelArguments, training_args: IPUTrainingArguments
) -> tuple[Any, Any]:
    """The question-answering model and its fast tokenizer (the offsets map answers back to the context)."""
    hub = model_args.hub_kwargs()
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path, **hub)
    if not tokenizer.is_fast:
        raise ValueError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; this script needs offset mappings. Use a model "
            "with a tokenizer.json (the `tokenizers` library), see https://huggingface.co/transformers/index.html"
        )
    model = example_utils.load_pretrained(
        AutoModelForQuestionAnswering, model_args.model_name_or_path, training_args, config=config, **hub
    )
    return model, tokenizer


def featurize(
    raw: dict[str, datasets.Dataset],
    split: str,
    fn: Callable,
    limit: int | None,
    features_kwargs: dict[str, Any],
    data_args: DataTrainingArguments,
    training_args: IPUTrainingArguments,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The split's examples (the first `limit`) and their features (one or more windows per example)."""
    flag = f"--do_{'train' if split == 'train' else 'eval'}"
    if split not in raw:
        raise ValueError(f"{flag} needs a {split} dataset")
    examples = raw[split]
    if limit is not None:
        examples = examples.select(range(min(limit, len(examples))))
    if len(examples) == 0:  # found before training, not after it and the save
        raise ValueError(
            f"{flag}: the {split} set is empty; check the file, its --*_articles range and --max_*_samples"
        )
    description = f"{split} features"
    with training_args.main_process_first(desc=description):
        features = examples.map(
            partial(fn, **features_kwargs),
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=examples.column_names,
            load_from_cache_file=not data_args.overwrite_cache,
            desc=description,
        )
    return examples, features


def build_features(
    raw: dict[str, datasets.Dataset], tokenizer: Any, data_args: DataTrainingArguments, training_args: Any
) -> dict[str, Any]:
    """`train` features, and (`examples`, `features`) for `validation` and `test`, for the splits the run needs."""
    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    if data_args.max_seq_length > tokenizer.model_max_length:
        logger.warning("max_seq_length %d > the model's %d: using the latter", data_args.max_seq_length, max_seq_length)
    kwargs = {"tokenizer": tokenizer, "max_seq_length": max_seq_length, "doc_stride": data_args.doc_stride}
    padded = {**kwargs, "pad_to_max_length": data_args.pad_to_max_length}
    out: dict[str, Any] = {"max_seq_length": max_seq_length}
    if training_args.do_train:
        # packed rows are built from unpadded features
        train_kwargs = {**kwargs, "pad_to_max_length": False} if data_args.packing else padded
        limit = data_args.max_train_samples
        _, train = featurize(raw, "train", prepare_train_features, limit, train_kwargs, data_args, training_args)
        if limit is not None:  # one example can give several features
            train = train.select(range(min(limit, len(train))))
        out["train"] = train
    wanted = [("validation", training_args.do_eval, data_args.max_eval_samples)]
    wanted.append(("test", training_args.do_predict, data_args.max_predict_samples))
    for split, on, limit in wanted:
        if on:
            out[split] = featurize(raw, split, prepare_validation_features, limit, padded, data_args, training_args)
    return out


def build_trainer(
    model: Any, tokenizer: Any, features: dict[str, Any], data_args: DataTrainingArguments, training_args: Any
) -> IPUQuestionAnsweringTrainer:
    """The QA trainer: answers post-processed from the logits, scored by SQuAD (v1.1 or v2.0); packed rows when
    `--packing`."""
    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    train_dataset, kwargs = features.get("train"), {}
    if data_args.packing and train_dataset is not None:
        # a dense block-diagonal mask for eager/sdpa attention, sequence ids (a BlockMask on the device) for flex
        packing = prepare_packed_training(
            model,
            train_dataset,
            features["max_seq_length"],
            tokenizer.pad_token_id,
            collator,
            packed_question_answering_loss,
            data_args.max_sequences_per_pack,
        )
        train_dataset, collator = packing.train_dataset, packing.data_collator
        # one `labels` tensor of per-sequence slots, read by the packed loss (the model gets no labels)
        training_args.label_names = ["labels"]
        kwargs["compute_loss_func"] = packing.compute_loss_func

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

    eval_examples, eval_dataset = features.get("validation", (None, None))
    return IPUQuestionAnsweringTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        eval_examples=eval_examples,
        processing_class=tokenizer,
        data_collator=collator,
        post_process_function=post_process,
        compute_metrics=squad_v2_metrics if data_args.version_2_with_negative else squad_metrics,
        **kwargs,
    )


def main() -> None:
    model_args, data_args, training_args, peft_args = example_utils.parse_args(
        example_utils.ModelArguments, DataTrainingArguments, IPUTrainingArguments, PeftArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)
    model, tokenizer = load_model_and_tokenizer(model_args, training_args)
    model = maybe_wrap_with_lora(model, peft_args, "QUESTION_ANS")  # --use_peft: the span head trains too
    features = build_features(raw, tokenizer, data_args, training_args)
    trainer = build_trainer(model, tokenizer, features, data_args, training_args)

    if training_args.do_train:
        rows, train_features = len(trainer.train_dataset), len(features["train"])

        def features_per_second(metrics: dict[str, Any]) -> dict[str, Any]:
            # packed: samples are rows; SQuAD features per second is the figure comparable with unpacked runs
            per_second = round(metrics["train_samples_per_second"] * train_features / rows, 3)
            return {"train_features": train_features, "train_features_per_second": per_second}

        extra = features_per_second if data_args.packing else None
        if not example_utils.train(trainer, training_args, last_checkpoint, rows, extra):
            return
    if training_args.do_eval:
        example_utils.evaluate(trainer, len(features["validation"][1]))
    if training_args.do_predict:
        predict_examples, predict_dataset = features["test"]
        example_utils.predict(trainer, predict_dataset, len(predict_dataset), predict_examples)
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
