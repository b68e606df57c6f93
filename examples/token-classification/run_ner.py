#!/usr/bin/env python
"""Fine-tune a `transformers` model for token classification (NER, POS, chunking) with `IPUTrainer`.

The recipe of Optimum Graphcore's `run_ner.py`, run from this folder (it reads `./ipu_config.json`):

    python run_ner.py --ipu_config_name=./ --model_name_or_path bert-base-uncased --dataset_name conll2003 \\
      --do_train --do_eval --max_seq_length 128 --output_dir ./output/conll2003/

Offline, give local files instead of `--dataset_name`: `--train_file` / `--validation_file` / `--test_file` take
CSV or JSON (lines) with one example per row: a list of words (`--text_column_name`, default `tokens`, else the
first column) and a list of their labels (`--label_column_name`, default `{task_name}_tags`, else the second
column), as strings (the label list is collected from the data) or class ids of a ClassLabel.
Entity-level precision / recall / F1 and token accuracy come from `seqeval`. Writes `train_results.json`,
`eval_results.json` and `all_results.json` (`eval_precision`, `eval_recall`, `eval_f1`, `eval_accuracy`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import datasets
import numpy as np
import transformers
from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score
from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
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
IGNORE_INDEX = -100  # the label of special tokens and of the non-first tokens of a word: left out of the loss


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
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a model whose classification head has another number of labels."}
    )


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to tokenize it."""

    task_name: str = field(default="ner", metadata={"help": "The task (ner, pos, chunk): names the label column."})
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset name (from the local datasets cache)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: CSV or JSON(L)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same formats."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data, same formats."})
    text_column_name: str | None = field(default=None, metadata={"help": "Column of the word lists."})
    label_column_name: str | None = field(default=None, metadata={"help": "Column of the label lists."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized datasets."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_seq_length: int | None = field(
        default=None, metadata={"help": "Tokens per example; default: the longest the tokenizer and model take."}
    )
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every example to max_seq_length (static shapes, one compiled graph)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep this many prediction examples."})
    label_all_tokens: bool = field(
        default=False,
        metadata={"help": "Label every token of a word (B- becomes I- after the first), not only the first."},
    )
    return_entity_level_metrics: bool = field(
        default=False, metadata={"help": "Report precision/recall/F1 of each entity type too, not only overall."}
    )

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("give --dataset_name or --train_file/--validation_file (CSV or JSON)")
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and path.rsplit(".", 1)[-1].lower() not in FILE_FORMATS:
                raise ValueError(f"--{name} {path}: expected a {', '.join(FILE_FORMATS)} file")
        self.task_name = self.task_name.lower()


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation / test splits, from local files or the local datasets cache."""
    files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}
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
    try:
        return dict(
            datasets.load_dataset(
                data.dataset_name, data.dataset_config_name, cache_dir=model.cache_dir, token=model.token
            )
        )
    except Exception as err:  # offline: DatasetNotFoundError, ConnectionError, OfflineModeIsEnabled, ...
        raise SystemExit(
            f"--dataset_name {data.dataset_name}: not in the local datasets cache and the Hub cannot be reached "
            f"({type(err).__name__}). Pass local files instead, e.g. --train_file "
            "../../../shared/data/fixtures/conll/sample.json --validation_file (the same file)"
        ) from None


def pick_column(given: str | None, default: str, position: int, columns: list[str], flag: str) -> str:
    """The column `--flag` names, else `default` if the data has it, else the one at `position` (as `transformers`'
    run_ner.py does); a clear error when it is not there."""
    if given is not None:
        if given not in columns:
            raise ValueError(f"--{flag} {given}: the data has no such column (columns: {', '.join(columns)})")
        return given
    if default in columns:
        return default
    if len(columns) <= position:
        raise ValueError(f"the data has {len(columns)} column(s) ({', '.join(columns)}); give --{flag}")
    return columns[position]


def max_model_length(tokenizer: transformers.PreTrainedTokenizerBase, config: PretrainedConfig) -> int:
    """The longest sequence both the tokenizer and the model's position table take."""
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions and config.model_type in ("roberta", "xlm-roberta", "camembert"):
        positions -= (config.pad_token_id or 0) + 1  # RoBERTa's positions start after the padding index
    return min(tokenizer.model_max_length, positions or tokenizer.model_max_length)


def seqeval_metrics(label_list: list[str], entity_level: bool) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics`: entity-level micro precision / recall / F1 and token accuracy from `seqeval` (the keys of
    the `seqeval` metric `transformers`' run_ner.py reports), on the first token of each word."""

    def compute(p: EvalPrediction) -> dict[str, float]:
        logits = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        predictions = np.argmax(logits, axis=2)
        y_true, y_pred = [], []
        for prediction, label in zip(predictions, p.label_ids, strict=True):
            kept = [
                (label_list[pr], label_list[la]) for pr, la in zip(prediction, label, strict=True) if la != IGNORE_INDEX
            ]
            y_pred.append([pr for pr, _ in kept])
            y_true.append([la for _, la in kept])
        overall = {
            "precision": precision_score(y_true, y_pred, zero_division=0),
            "recall": recall_score(y_true, y_pred, zero_division=0),
            "f1": f1_score(y_true, y_pred, zero_division=0),
            "accuracy": accuracy_score(y_true, y_pred),
        }
        if not entity_level:
            return {key: float(value) for key, value in overall.items()}
        results = {f"overall_{key}": float(value) for key, value in overall.items()}
        report = classification_report(y_true, y_pred, output_dict=True, zero_division=0)
        for entity, scores in report.items():
            if entity.endswith(" avg"):
                continue
            for key, name in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score")):
                results[f"{entity}_{key}"] = float(scores[name])
            results[f"{entity}_number"] = int(scores["support"])
        return results

    return compute


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
    reference = raw["train"] if "train" in raw else raw.get("validation", next(iter(raw.values())))
    columns = reference.column_names
    text_column = pick_column(data_args.text_column_name, "tokens", 0, columns, "text_column_name")
    label_column = pick_column(
        data_args.label_column_name, f"{data_args.task_name}_tags", 1, columns, "label_column_name"
    )
    for split_name, split in raw.items():
        needed = (text_column,) if split_name == "test" else (text_column, label_column)  # test: labels optional
        missing = [c for c in needed if c not in split.column_names]
        if missing:
            raise ValueError(
                f"the {split_name} data has no column {', '.join(missing)} (columns: {', '.join(split.column_names)})"
                "; set --text_column_name / --label_column_name"
            )

    # ClassLabel sequences carry their names; otherwise the labels are the strings found in the data, sorted.
    label_feature = getattr(reference.features[label_column], "feature", None)
    labels_are_int = isinstance(label_feature, datasets.ClassLabel)
    if labels_are_int:
        label_list = list(label_feature.names)
        label_to_id = {i: i for i in range(len(label_list))}
    else:
        found = set()
        for split in raw.values():
            if label_column in split.column_names:
                found.update(label for labels in split[label_column] for label in labels)
        label_list = sorted(found, key=str)
        label_to_id = {label: i for i, label in enumerate(label_list)}
    num_labels = len(label_list)

    hub = {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }
    config = AutoConfig.from_pretrained(
        model_args.config_name or model_args.model_name_or_path,
        num_labels=num_labels,
        **hub,
    )
    # Byte-level BPE tokenizers need a space before each pre-split word to tokenize it as inside a sentence.
    tokenizer_kwargs = {"add_prefix_space": True} if config.model_type in ("gpt2", "roberta", "deberta") else {}
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=True, **tokenizer_kwargs, **hub
    )
    if not tokenizer.is_fast:
        raise ValueError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; this script needs word ids. Use a model with a "
            "tokenizer.json (the `tokenizers` library), see https://huggingface.co/transformers/index.html"
        )
    if tokenizer.pad_token is None:  # GPT-2: pad with end-of-text
        tokenizer.pad_token = tokenizer.eos_token
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForTokenClassification.from_pretrained(
        model_args.model_name_or_path, config=config, ignore_mismatched_sizes=model_args.ignore_mismatched_sizes, **hub
    )

    # A model fine-tuned with the same label names keeps its ids; any other mapping is replaced by the data's.
    model_label2id = {str(k): int(v) for k, v in model.config.label2id.items()}
    if model_label2id != PretrainedConfig(num_labels=num_labels).label2id:
        if sorted(model_label2id) == sorted(str(label) for label in label_list):
            if labels_are_int:
                label_to_id = {i: model_label2id[str(label)] for i, label in enumerate(label_list)}
            label_list = [name for name, _ in sorted(model_label2id.items(), key=lambda kv: kv[1])]
            if not labels_are_int:
                label_to_id = {label: i for i, label in enumerate(label_list)}
        else:
            logger.warning("the model's labels %s do not match the data's: using the data's", model_label2id)
    model.config.label2id = {str(label): i for i, label in enumerate(label_list)}
    model.config.id2label = {i: str(label) for i, label in enumerate(label_list)}
    label_names = [str(label) for label in label_list]

    # With --label_all_tokens, the tokens after the first of a B-X word get I-X (when the data has I-X).
    b_to_i_label = [
        label_names.index("I-" + name[2:]) if name.startswith("B-") and "I-" + name[2:] in label_names else index
        for index, name in enumerate(label_names)
    ]

    longest = max_model_length(tokenizer, config)
    max_seq_length = min(data_args.max_seq_length or longest, longest)
    if data_args.max_seq_length is not None and data_args.max_seq_length > longest:
        logger.warning("max_seq_length %d > the model's %d: using the latter", data_args.max_seq_length, longest)
    padding = "max_length" if data_args.pad_to_max_length else False

    def tokenize_and_align_labels(examples: dict[str, list]) -> dict[str, list]:
        tokenized = tokenizer(
            examples[text_column],
            padding=padding,
            truncation=True,
            max_length=max_seq_length,
            is_split_into_words=True,  # the texts are lists of words
        )
        if label_column not in examples:
            return tokenized
        all_labels = []
        for i, word_labels in enumerate(examples[label_column]):
            previous, label_ids = None, []
            for word in tokenized.word_ids(batch_index=i):
                if word is None:
                    label_ids.append(IGNORE_INDEX)
                elif word != previous:
                    label_ids.append(label_to_id[word_labels[word]])
                else:
                    label_ids.append(
                        b_to_i_label[label_to_id[word_labels[word]]] if data_args.label_all_tokens else IGNORE_INDEX
                    )
                previous = word
            all_labels.append(label_ids)
        tokenized["labels"] = all_labels
        return tokenized

    def tokenized(split: str, limit: int | None, flag: str) -> datasets.Dataset:
        if split not in raw:
            raise ValueError(f"{flag} needs a {split} dataset: give --{split}_file")
        examples = raw[split]
        if limit is not None:
            examples = examples.select(range(min(limit, len(examples))))
        with training_args.main_process_first(desc=f"tokenize {split}"):
            return examples.map(
                tokenize_and_align_labels,
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=examples.column_names,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Running tokenizer on {split}",
            )

    train_dataset = eval_dataset = predict_dataset = None
    if training_args.do_train:
        train_dataset = tokenized("train", data_args.max_train_samples, "--do_train")
    if training_args.do_eval:
        eval_dataset = tokenized("validation", data_args.max_eval_samples, "--do_eval")
    if training_args.do_predict:
        predict_dataset = tokenized("test", data_args.max_predict_samples, "--do_predict")

    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)

    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=seqeval_metrics(label_names, data_args.return_entity_level_metrics),
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

    if training_args.do_predict:
        logger.info("*** Predict ***")
        output = trainer.predict(predict_dataset, metric_key_prefix="predict")
        if "labels" in predict_dataset.column_names:
            output.metrics["predict_samples"] = len(predict_dataset)
            trainer.log_metrics("predict", output.metrics)
            trainer.save_metrics("predict", output.metrics)
        # One line of labels per example: the prediction of each word's first token.
        logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
        examples = raw["test"].select(range(len(predict_dataset)))
        if trainer.is_world_process_zero():
            path = os.path.join(training_args.output_dir, "predictions.txt")
            encoded = tokenizer(
                list(examples[text_column]), is_split_into_words=True, truncation=True, max_length=max_seq_length
            )
            with open(path, "w", encoding="utf-8") as writer:
                for i, row in enumerate(np.argmax(logits, axis=2)):
                    word_ids = encoded.word_ids(batch_index=i)
                    firsts = [t for t, w in enumerate(word_ids) if w is not None and (t == 0 or word_ids[t - 1] != w)]
                    writer.write(" ".join(label_names[row[t]] for t in firsts) + "\n")
            logger.info("Predictions written to %s", path)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
