"""What `run_clm.py` and `run_mlm.py` share: model arguments, raw text loading, model/tokenizer set-up, tokenizing
the texts and cutting them into blocks, the splits trained and evaluated on, and the metrics.

The behaviour is that of the `transformers` v4 examples (`examples/pytorch/language-modeling`): the same flags,
the same split of a lone training set into train / validation (`--validation_split_percentage`), the same
`perplexity = exp(eval_loss)` and token accuracy (here computed by `torchmetrics`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import datasets
import numpy as np
import torch
from torchmetrics.functional import accuracy
from transformers import CONFIG_MAPPING, AutoConfig, AutoTokenizer, EvalPrediction

import example_utils
import optimum_ipu

logger = logging.getLogger(__name__)

# Local file formats -> the `datasets` builder that reads them. WikiText's own files end in `.tokens` / `.raw`.
FILE_BUILDERS = {
    "txt": "text",
    "text": "text",
    "tokens": "text",
    "raw": "text",
    "csv": "csv",
    "json": "json",
    "jsonl": "json",
}
TORCH_DTYPES = ("auto", "bfloat16", "float16", "float32")
LOCAL_FILES_HINT = "--train_file wiki.train.tokens --validation_file wiki.valid.tokens (plain text, CSV or JSON lines)"


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to train (from a checkpoint, or from scratch with `--model_type`)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Model id on the Hugging Face Hub (downloaded once, then cached) or a folder; leave out to train "
            "from scratch (with --model_type or --config_name)."
        },
    )
    model_type: str | None = field(
        default=None, metadata={"help": "Model type to train from scratch, e.g. gpt2, roberta, bert."}
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": 'Config values to override when training from scratch: "n_embd=128,n_layer=4".'},
    )
    config_name: str | None = field(default=None, metadata={"help": "Config folder or id, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer folder or id, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloaded models are cached."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (`tokenizers`) tokenizer."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})
    torch_dtype: str | None = field(
        default=None, metadata={"help": f"dtype the weights are loaded in: {', '.join(TORCH_DTYPES)}."}
    )

    def __post_init__(self) -> None:
        if self.config_overrides is not None and (self.config_name is not None or self.model_name_or_path):
            raise ValueError(
                "--config_overrides can't be used in combination with --config_name or --model_name_or_path: "
                "it changes the config of a model trained from scratch (--model_type); leave it out to fine-tune "
                "the pretrained model (Optimum Graphcore's run_clm.py and run_mlm.py refuse this pair too)"
            )
        if self.model_type is not None and self.model_type not in CONFIG_MAPPING:
            raise ValueError(f"--model_type {self.model_type}: unknown; e.g. gpt2, roberta, bert")
        if self.torch_dtype is not None and self.torch_dtype not in TORCH_DTYPES:
            raise ValueError(f"--torch_dtype {self.torch_dtype}: expected one of {', '.join(TORCH_DTYPES)}")
        if self.model_name_or_path is None and self.config_name is None and self.model_type is None:
            raise ValueError(
                "give --model_name_or_path, or --model_type (e.g. gpt2) / --config_name to train from scratch"
            )


def file_builder(path: str, flag: str) -> str:
    """The `datasets` builder for a local file (`text` for .txt / .tokens / .raw), or a clear error."""
    extension = path.rsplit(".", 1)[-1].lower() if "." in os.path.basename(path) else ""
    if extension not in FILE_BUILDERS:
        raise ValueError(f"--{flag} {path}: expected a {', '.join(sorted(FILE_BUILDERS))} file")
    return FILE_BUILDERS[extension]


def check_data_arguments(data_args: Any) -> None:
    """Shared checks of the data flags: some data, known file formats, files that exist, a sane split."""
    if data_args.dataset_name is None and data_args.train_file is None and data_args.validation_file is None:
        raise ValueError(
            "give --dataset_name (e.g. --dataset_name Salesforce/wikitext --dataset_config_name wikitext-2-raw-v1) or "
            f"local files, e.g. {LOCAL_FILES_HINT}"
        )
    if not 0 < data_args.validation_split_percentage < 100:
        raise ValueError(
            f"--validation_split_percentage {data_args.validation_split_percentage}: expected a percentage in (0, 100)"
        )
    builders = set()
    for flag in ("train_file", "validation_file"):
        path = getattr(data_args, flag)
        if path is not None:
            builders.add(file_builder(path, flag))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"--{flag} {path}: no such file")
    if len(builders) > 1:
        raise ValueError("--train_file and --validation_file must have the same format (both text, CSV or JSON)")


def load_raw_datasets(data_args: Any, model_args: ModelArguments) -> datasets.DatasetDict:
    """`train` and `validation` splits from local files or the Hugging Face Hub (or its local cache).

    Without a validation split, the first `validation_split_percentage` % of the training set becomes it and the
    rest is trained on, as in the `transformers` examples.
    """
    percent = data_args.validation_split_percentage
    if data_args.dataset_name is not None:
        hub = {"cache_dir": model_args.cache_dir, "token": model_args.token}
        name, config = data_args.dataset_name, data_args.dataset_config_name
        raw = example_utils.load_hub_dataset(name, config, local_files_hint=LOCAL_FILES_HINT, **hub)
        if "validation" not in raw:
            raw["validation"] = datasets.load_dataset(name, config, split=f"train[:{percent}%]", **hub)
            raw["train"] = datasets.load_dataset(name, config, split=f"train[{percent}%:]", **hub)
        return raw
    data_files = {}
    if data_args.train_file is not None:
        data_files["train"] = data_args.train_file
    if data_args.validation_file is not None:
        data_files["validation"] = data_args.validation_file
    builder = file_builder(next(iter(data_files.values())), "train_file")
    kwargs: dict[str, Any] = {"cache_dir": model_args.cache_dir, "token": model_args.token}
    if builder == "text":
        kwargs["keep_linebreaks"] = getattr(data_args, "keep_linebreaks", True)
        kwargs["encoding"] = "utf-8-sig"  # a byte-order mark is no text: not the start of the first line
    raw = datasets.load_dataset(builder, data_files=data_files, **kwargs)
    if "validation" not in raw and "train" in raw:
        raw["validation"] = datasets.load_dataset(builder, data_files=data_files, split=f"train[:{percent}%]", **kwargs)
        raw["train"] = datasets.load_dataset(builder, data_files=data_files, split=f"train[{percent}%:]", **kwargs)
    return raw


def load_config_and_tokenizer(model_args: ModelArguments) -> tuple[Any, Any]:
    """The model config (pretrained, or new for `--model_type` with `--config_overrides`) and the tokenizer."""
    hub = example_utils.hub_kwargs(model_args)
    if model_args.config_name:
        config = AutoConfig.from_pretrained(model_args.config_name, **hub)
    elif model_args.model_name_or_path:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, **hub)
    else:
        config = CONFIG_MAPPING[model_args.model_type]()
        logger.warning("You are instantiating a new config instance from scratch.")
        if model_args.config_overrides is not None:
            logger.info("Overriding config: %s", model_args.config_overrides)
            try:
                config.update_from_string(model_args.config_overrides)
            except ValueError as err:
                raise example_utils.overrides_error(model_args.config_overrides, err) from None
            logger.info("New config: %s", config)
    name = model_args.tokenizer_name or model_args.model_name_or_path
    if not name:
        raise ValueError(
            "You are instantiating a new tokenizer from scratch. This is not supported by this script. Train one "
            "with train_tokenizer.py (in this folder), save it, and load it from here using --tokenizer_name."
        )
    tokenizer = AutoTokenizer.from_pretrained(name, use_fast=model_args.use_fast_tokenizer, **hub)
    return config, tokenizer


def load_model(auto_class: Any, model_args: ModelArguments, config: Any, tokenizer: Any, training_args: Any) -> Any:
    """The pretrained model (only this process's stage of it with stages on processes: `example_utils.load_pretrained`),
    or a new one from the config; embeddings grown to the tokenizer if it is larger."""
    if model_args.model_name_or_path:
        dtype = (
            model_args.torch_dtype
            if model_args.torch_dtype in (None, "auto")
            else getattr(torch, model_args.torch_dtype)
        )
        model = example_utils.load_pretrained(
            auto_class,
            model_args.model_name_or_path,
            training_args,
            vocabulary=len(tokenizer),
            config=config,
            cache_dir=model_args.cache_dir,
            revision=model_args.model_revision,
            token=model_args.token,
            trust_remote_code=model_args.trust_remote_code,
            dtype=dtype,
        )
    else:
        model = auto_class.from_config(config, trust_remote_code=model_args.trust_remote_code)
        n_params = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
        logger.info("Training new model from scratch - Total size=%.2fM params", n_params / 2**20)
    example_utils.grow_embeddings(model, tokenizer)
    return model


def max_positions(config: Any) -> int | None:
    """How many tokens one sequence of the model may hold: its position table less the first position id, as the
    model's stage plan says (RoBERTa-like models lose `pad_token_id + 1` positions to their position-id offset)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    return positions - optimum_ipu.position_offset(config)


def sequence_length(requested: int | None, flag: str, tokenizer: Any, config: Any) -> int:
    """The length of every training sequence: `--block_size` / `--max_seq_length`, or the tokenizer's maximum
    capped at 1024 and at the model's positions, as in the `transformers` examples."""
    positions = max_positions(config)
    if requested is None:
        length = min(tokenizer.model_max_length, 1024)
        if tokenizer.model_max_length > 1024:
            logger.warning(
                "The tokenizer picked seems to have a very large `model_max_length` (%s). Using %s instead; "
                "override it with --%s xxx.",
                tokenizer.model_max_length,
                length,
                flag,
            )
        if positions is not None and length > positions:
            logger.warning("--%s: using the model's %d positions", flag, positions)
            length = positions
        return length
    if requested < 2:
        raise ValueError(f"--{flag} {requested}: expected at least 2 tokens per sequence")
    if positions is not None and requested > positions:
        raise ValueError(f"--{flag} {requested}: the model has only {positions} positions; use at most {positions}")
    if requested > tokenizer.model_max_length:
        logger.warning(
            "--%s %d is larger than the maximum length for the model (%d). Using %d.",
            flag,
            requested,
            tokenizer.model_max_length,
            tokenizer.model_max_length,
        )
    return min(requested, tokenizer.model_max_length)


def text_column(dataset: Any) -> str:
    """`text` if the data has such a column, else its first column (as in the `transformers` examples)."""
    names = list(dataset.features)
    return "text" if "text" in names else names[0]


def raw_text_columns(raw: datasets.DatasetDict, training_args: Any) -> tuple[str, list[str]]:
    """The column of the texts and every column (dropped once tokenized), read from the split the run starts with
    (`train`, else `validation`); a clear error when that split is missing."""
    split = "train" if training_args.do_train else "validation"
    if split not in raw:
        raise ValueError(f"--do_{'train' if split == 'train' else 'eval'} requires a {split} dataset")
    return text_column(raw[split]), list(raw[split].features)


def map_texts(
    dataset: datasets.DatasetDict,
    function: Callable[..., dict],
    data_args: Any,
    training_args: Any,
    desc: str,
    process_desc: str = "dataset map tokenization",
    **kwargs: Any,
) -> datasets.DatasetDict:
    """A batched `dataset.map(function, **kwargs)` on the main process first (the others read its cache), with the
    script's `--preprocessing_num_workers` and `--overwrite_cache`."""
    with training_args.main_process_first(desc=process_desc):
        return dataset.map(
            function,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            desc=desc,
            **kwargs,
        )


def group_texts(examples: dict[str, list[list[Any]]], block_size: int, labels: bool = False) -> dict[str, list[list]]:
    """Concatenate the tokenized texts and cut them into full blocks of `block_size` (the remainder is dropped, so
    every block has the same length). With `labels`, the labels are the inputs (a causal model shifts them); else
    the collator adds them (masked LM)."""
    concatenated = {k: list(chain(*examples[k])) for k in examples}
    total_length = (len(concatenated["input_ids"]) // block_size) * block_size
    result = {k: [t[i : i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated.items()}
    if labels:
        result["labels"] = result["input_ids"].copy()
    return result


def tokenize_in_blocks(
    raw: datasets.DatasetDict,
    tokenize: Callable[[dict[str, list[str]]], Any],
    block_size: int,
    data_args: Any,
    training_args: Any,
    desc: str,
    labels: bool = False,
) -> datasets.DatasetDict:
    """Every split tokenized by `tokenize` (its `desc` shown), then cut into full blocks of `block_size` tokens
    ([`group_texts`])."""
    _, column_names = raw_text_columns(raw, training_args)
    tokenized = map_texts(raw, tokenize, data_args, training_args, desc, remove_columns=column_names)
    return map_texts(
        tokenized,
        group_texts,
        data_args,
        training_args,
        f"Grouping texts in chunks of {block_size}",
        "grouping texts together",
        fn_kwargs={"block_size": block_size, "labels": labels},
    )


def perplexity(eval_loss: float) -> float:
    """`exp(eval_loss)`, `inf` on overflow, exactly as the `transformers` examples report it."""
    try:
        return math.exp(eval_loss)
    except OverflowError:
        return float("inf")


def preprocess_logits_for_metrics(logits: Any, labels: Any) -> torch.Tensor:
    """Keep only the predicted token ids, so evaluation never holds every `[tokens, vocabulary]` logit."""
    if isinstance(logits, tuple):  # models may return more than the logits (past key values, ...)
        logits = logits[0]
    return logits.argmax(dim=-1)


def token_accuracy(num_classes: int, causal: bool) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics` giving `accuracy` over the predicted tokens (torchmetrics, micro average).

    Args:
        num_classes (`int`): the vocabulary size.
        causal (`bool`): position t predicts token t + 1 (the labels are shifted); else, masked LM: only tokens
            whose label is not -100 count.
    """

    def compute(prediction: EvalPrediction) -> dict[str, float]:
        preds, labels = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
        if causal:
            preds, labels = preds[:, :-1], labels[:, 1:]
        preds, labels = preds.reshape(-1), labels.reshape(-1)
        keep = labels != -100  # MLM: unmasked tokens; also padding between batches of different lengths
        preds, labels = torch.as_tensor(preds[keep]).long(), torch.as_tensor(labels[keep]).long()
        if labels.numel() == 0:
            return {"accuracy": float("nan")}
        return {"accuracy": float(accuracy(preds, labels, task="multiclass", num_classes=num_classes, average="micro"))}

    return compute


def select_splits(lm_datasets: Any, data_args: Any, training_args: Any, too_short: str) -> tuple[Any, Any]:
    """The training and evaluation sets the run needs, cut to `--max_train_samples` / `--max_eval_samples`.

    Raises:
        `ValueError`: a split the run needs is missing, or holds no sequence (`too_short`, with `{name}` the
            split's: `training` or `evaluation`).
    """
    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = lm_datasets["train"]
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
    if training_args.do_eval:
        if "validation" not in lm_datasets:
            raise ValueError("--do_eval requires a validation dataset")
        eval_dataset = lm_datasets["validation"]
        if data_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))
    for name, dataset in (("training", train_dataset), ("evaluation", eval_dataset)):
        if dataset is not None and len(dataset) == 0:
            raise ValueError(too_short.format(name=name))
    return train_dataset, eval_dataset


def metric_kwargs(config: Any, training_args: Any, causal: bool) -> dict[str, Any]:
    """`IPUTrainer`'s `compute_metrics` (token accuracy) and `preprocess_logits_for_metrics` (the predicted ids),
    when the run evaluates."""
    if not training_args.do_eval:
        return {"compute_metrics": None, "preprocess_logits_for_metrics": None}
    return {
        "compute_metrics": token_accuracy(config.vocab_size, causal=causal),
        "preprocess_logits_for_metrics": preprocess_logits_for_metrics,
    }


def evaluate(trainer: Any, num_samples: int) -> dict[str, Any]:
    """[`example_utils.evaluate`] with `perplexity = exp(eval_loss)` among the metrics."""
    return example_utils.evaluate(trainer, num_samples, lambda m: {"perplexity": perplexity(m["eval_loss"])})
