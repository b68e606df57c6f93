"""What every example script does alike: model arguments, argument parsing, logging, loading a named dataset (with
one clear message when the Hub cannot be reached), and the train / evaluate / predict tail that saves the metrics and
draws `training_curves.png` beside `all_results.json`.

It is installed with the package (`pip install -e ".[examples]"` in a checkout, `pip install "optimum-ipu[examples]"`)
and the scripts import it as `example_utils`; beside it they import only the public API of `optimum_ipu`. Its
submodules hold what a few scripts share: `seq2seq` (`run_translation.py`, `run_summarization.py`),
`language_modeling` (`run_clm.py`, `run_mlm.py`), `classification` (the image and audio classifiers) and `audio` (the
speech scripts' data). Importing it answers a script's lone `--help` from the text its full parser cached before, if
that text is fresh (`help_cache`), before the imports that take seconds.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .help_cache import answer_help_from_cache, store_help

answer_help_from_cache()  # `run_*.py --help` from the text an earlier run cached, before the seconds of imports below

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import transformers  # noqa: E402
from transformers import HfArgumentParser  # noqa: E402

import optimum_ipu  # noqa: E402
from optimum_ipu.files import nearest_sibling, read_json_file  # noqa: E402

from .input_checks import check_text_encodings, overrides_error  # noqa: E402
from .json_args import checked_json_args  # noqa: E402

logger = logging.getLogger("example_utils")


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune, and how to reach them on the Hugging Face Hub."""

    model_name_or_path: str = field(
        metadata={"help": "Model id on the Hugging Face Hub (downloaded once, then read from the cache) or a folder."}
    )
    config_name: str | None = field(default=None, metadata={"help": "Config id or folder, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer id or folder, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (`tokenizers`) tokenizer."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model on the Hub."})
    token: str | None = field(
        default=None, metadata={"help": "Hugging Face Hub token (default: the one `hf auth login` stored)."}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})

    def hub_kwargs(self) -> dict[str, Any]:
        """`cache_dir`, `revision`, `token`, `trust_remote_code`: what every `from_pretrained` call takes."""
        return hub_kwargs(self)


def hub_kwargs(model_args: Any) -> dict[str, Any]:
    """The `from_pretrained` keywords of any model-arguments dataclass with the usual Hub fields."""
    return {
        "cache_dir": getattr(model_args, "cache_dir", None),
        "revision": getattr(model_args, "model_revision", "main"),
        "token": getattr(model_args, "token", None),
        "trust_remote_code": model_args.trust_remote_code,  # the user's --trust_remote_code only (False by default)
    }


# Flags of Optimum Graphcore's example commands that mean nothing here: the reason and what to pass instead. Its other
# flags are read with their meaning there (`IPUTrainingArguments` translates `--pod_type`, `--evaluation_strategy`,
# `--push_to_hub_model_id`, ...; `OPTIMUM_GRAPHCORE_SPELLINGS` below).
OPTIMUM_GRAPHCORE_ONLY_FLAGS = {
    "--logging_dir": "transformers 5 takes TensorBoard's folder from the environment: set TENSORBOARD_LOGGING_DIR=DIR",
    "--past_index": "transformers 5 dropped it (the memories of Transformer-XL and XLNet); leave it out",
    "--per_gpu_train_batch_size": "transformers 5 dropped it; pass --per_device_train_batch_size",
    "--per_gpu_eval_batch_size": "transformers 5 dropped it; pass --per_device_eval_batch_size",
}
# Abbreviations that argparse resolved under transformers 4 and finds ambiguous under 5 (`--lr_scheduler_kwargs`).
OPTIMUM_GRAPHCORE_SPELLINGS = {"--lr_schedule": "--lr_scheduler_type"}
MAX_ARGUMENT_FILE_BYTES = 1 << 20  # a JSON argument file holds a few dozen flags


def optimum_graphcore_argv(argv: list[str]) -> list[str]:
    """
    `argv` with Optimum Graphcore's spellings of a flag written as this library's, after refusing its flags that mean
    nothing here.

    Raises:
        `ValueError`: one line naming the first such flag, why it means nothing here and what to pass instead.
    """
    translated = []
    for arg in argv:
        flag, equals, value = arg.partition("=")
        if flag in OPTIMUM_GRAPHCORE_ONLY_FLAGS:
            raise ValueError(f"{flag} (an Optimum Graphcore flag): {OPTIMUM_GRAPHCORE_ONLY_FLAGS[flag]}")
        if flag in OPTIMUM_GRAPHCORE_SPELLINGS:
            logger.warning("%s (Optimum Graphcore's spelling) read as %s", flag, OPTIMUM_GRAPHCORE_SPELLINGS[flag])
            arg = OPTIMUM_GRAPHCORE_SPELLINGS[flag] + equals + value
        translated.append(arg)
    return translated


def parse_args(*dataclass_types: type) -> tuple:
    """The script's dataclasses from the command line, or from a single `.json` argument (as upstream).

    Optimum Graphcore's example commands (and its JSON argument files) parse as they are (see
    `optimum_graphcore_argv`), or stop in one line that names the one flag that means nothing here. A JSON file's
    values are read with their fields' types as the command line reads them (`json_args.checked_json_args`:
    `"do_train": "false"` is false, a wrong type is one line naming the key, the value and the type wanted).
    The parser's help text is cached for the script's next `--help` (`help_cache.store_help`).
    """
    parser = HfArgumentParser(dataclass_types)
    store_help(parser, dataclass_types)  # for the next `--help` (help_cache)
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        # the checks an ipu_config.json gets: a FIFO, /dev/zero or a 100,000-deep file is one line, not a hang
        values = read_json_file(os.path.abspath(sys.argv[1]), "an argument file", MAX_ARGUMENT_FILE_BYTES)
        if not isinstance(values, dict):
            raise ValueError(f"{sys.argv[1]}: an argument file holds one JSON object of flag names and values")
        names = [flag.removeprefix("--") for flag in optimum_graphcore_argv([f"--{key}" for key in values])]
        named = dict(zip(names, values.values(), strict=True))
        parsed = parser.parse_dict(checked_json_args(parser, dataclass_types, named, sys.argv[1]))
    else:
        parsed = parser.parse_args_into_dataclasses(args=optimum_graphcore_argv(sys.argv[1:]))
    check_text_encodings(*parsed)
    return parsed


def new_config(model_type: str, overrides: str | None) -> transformers.PretrainedConfig:
    """The config of a model trained from scratch: the family's defaults with `--config_overrides`, given as
    `key=value,...` (scalars, `transformers`' `update_from_string`) or as a JSON object of constructor arguments
    (lists too, e.g. `{"conv_dim": [32, 32]}`); a clear error for an unknown key or a bad value."""
    config_class = transformers.CONFIG_MAPPING[model_type]
    try:
        if overrides and overrides.lstrip().startswith("{"):
            values = json.loads(overrides)
            defaults = config_class()
            unknown = [key for key in values if not hasattr(defaults, key)]
            if unknown:
                raise ValueError(f"{model_type} configs have no {', '.join(unknown)}")
            return config_class(**values)
        config = config_class()
        if overrides:
            config.update_from_string(overrides)
        return config
    except (ValueError, TypeError) as err:
        raise overrides_error(overrides, err) from None


def setup_logging(training_args: Any, *loggers: logging.Logger) -> None:
    """The upstream scripts' logging: one format on stdout, the process's level (main rank: info) for the script,
    `optimum_ipu`, `datasets` and `transformers`; the training arguments logged once."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    for each in (*loggers, logger, logging.getLogger("optimum_ipu")):
        each.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.info("Training/evaluation parameters %s", training_args)


def start_run(training_args: Any) -> str | None:
    """Checks the output folder and the IPU config before any data or model is loaded.

    Returns:
        The last checkpoint of a non-empty `output_dir` (resumed from), or `None`; a non-empty folder without a
        checkpoint is refused unless `--overwrite_output_dir`.
    """
    last_checkpoint = training_args.checkpoint_in_output_dir()
    training_args.load_ipu_config()  # a bad config or override: refused now, in one line
    return last_checkpoint


def load_pretrained(
    auto_class: Any, name_or_path: str, training_args: Any, vocabulary: int | None = None, **kwargs: Any
) -> Any:
    """
    `auto_class.from_pretrained(name_or_path, **kwargs)`, the stock `transformers` model; under `torchrun` with the
    IPU config's stages on separate processes, each process builds it on the meta device and reads only its own
    stage's tensors (`optimum_ipu`'s auto class of the same name, with `ipu_config=`), the other stages' parameters
    staying on the meta device (LoRA adapters put on it by `--use_peft` take them over: the base model is never whole).

    Args:
        auto_class (`type`): A `transformers` auto class, e.g. `AutoModelForQuestionAnswering`.
        name_or_path (`str`): A model folder or Hub id.
        training_args (`IPUTrainingArguments`): The run's arguments (its IPU config, `--ipu_config_overrides` applied).
        vocabulary (`int`, *optional*): The tokenizer's size. When it is larger than the checkpoint's vocabulary (the
            `config` given), the script grows the embeddings with `resize_token_embeddings`, which needs the whole
            embedding matrix (`transformers`' mean resizing draws the new rows from its covariance): the whole model
            is loaded then, as without stages, and a line says why.
        kwargs: `from_pretrained`'s keyword arguments (`config`, `dtype`, Hub options, `ignore_mismatched_sizes`).
    """
    ipu_config = training_args.load_ipu_config()
    stages = ipu_config.value("ipus_per_replica")
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or stages <= 1:
        return auto_class.from_pretrained(name_or_path, **kwargs)
    checkpoint_vocabulary = getattr(kwargs.get("config"), "vocab_size", None)
    if vocabulary is not None and checkpoint_vocabulary is not None and vocabulary > checkpoint_vocabulary:
        logger.warning(
            "loading the whole of %s in every process: its embeddings (%d rows) grow to the tokenizer's %d tokens, "
            "which needs the whole embedding matrix; resize and save it once in one process to load one stage only",
            name_or_path,
            checkpoint_vocabulary,
            vocabulary,
        )
        return auto_class.from_pretrained(name_or_path, **kwargs)
    training_args.device  # noqa: B018 -- creates the process group that the stage mesh is made in
    # processes are laid out (replica, stage), row-major: the stage is the rank modulo the stages
    # a warning, so that every process says it whatever the log level (a model that is not whole on any process)
    stage = int(os.environ.get("RANK", "0")) % stages
    logger.warning(
        "loading stage %d of %d only of %s (the others stay on the meta device)", stage, stages, name_or_path
    )
    stage_class = getattr(optimum_ipu, auto_class.__name__)
    # the stock modules, unserialized, as `from_pretrained` gives them: the adapters of `--use_peft` go on them, and
    # IPUTrainer parallelizes the model as it does without stages (an adapted serialized module refused there)
    return stage_class.from_pretrained(name_or_path, ipu_config=ipu_config, **kwargs).deparallelize()


def grow_embeddings(model: Any, tokenizer: Any) -> None:
    """Grow `model`'s token embeddings to `tokenizer`'s size when it is larger, as upstream's scripts do (a smaller
    embedding breaks lookups; a larger one is kept as it is). With stages on processes, `load_pretrained` given the
    tokenizer's size has loaded the whole model for it."""
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))


# The scripts' size flags, each an integer of at least 1 when given (`check_at_least_one`).
SIZE_FLAGS = ("max_seq_length", "max_train_samples", "max_eval_samples", "max_predict_samples")
# The splits a run of the train / evaluate / predict scripts reads, each with the flag that asks for it.
SPLIT_FLAGS = {"train": "do_train", "validation": "do_eval", "test": "do_predict"}


def check_at_least_one(args: Any, flags: tuple[str, ...] = SIZE_FLAGS) -> None:
    """
    Each of `args`' `flags` that is given is at least 1.

    Raises:
        `ValueError`: one line naming the first that is not (`--max_train_samples 0: expected an integer >= 1`).
    """
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} {value}: expected an integer >= 1")


def requested_splits(training_args: Any) -> list[str]:
    """The splits the run reads: train (`--do_train`), validation (`--do_eval`), test (`--do_predict`)."""
    return [split for split, flag in SPLIT_FLAGS.items() if getattr(training_args, flag)]


def check_columns(raw: Mapping[str, datasets.Dataset], columns: Mapping[str, str]) -> None:
    """
    Every split has the columns the flags name (`{"--label_column_name": "label", ...}`).

    Raises:
        `ValueError`: one line naming the first missing column's flag, the split and the columns it has.
    """
    for split, dataset in raw.items():
        for flag, column in columns.items():
            if column not in dataset.column_names:
                raise ValueError(
                    f"{flag} {column}: the {split} data has no such column (columns: "
                    f"{', '.join(dataset.column_names)}); name the right one"
                )


def require_files(files: Mapping[str, str | None]) -> None:
    """
    Each path given of `{"train": path, ...}` is a file.

    Raises:
        `FileNotFoundError`: one line naming the flag of the first that is not (`--train_file nope.json: no such
            file`), with the nearest name in its folder when one is close (a typo).
    """
    for split, path in files.items():
        if path is not None and not os.path.isfile(path):
            sibling = nearest_sibling(path, cutoff=0.8)
            hint = f"; did you mean {os.path.join(os.path.dirname(path), sibling)}?" if sibling else ""
            raise FileNotFoundError(f"--{split}_file {path}: no such file{hint}")


def load_data_files(files: Mapping[str, str | None], cache_dir: str | None) -> dict[str, datasets.Dataset]:
    """
    The splits of local CSV or JSON (lines) files, `{"train": path, ...}` (those given), each read by the `csv` or
    `json` builder of `datasets` from its extension.

    Raises:
        `FileNotFoundError`: one line naming the flag (`--train_file`, ...) of a file that is not there.
    """
    require_files(files)
    raw = {}
    for split, path in files.items():
        if path is None:
            continue
        builder = "csv" if path.lower().endswith(".csv") else "json"
        raw[split] = datasets.load_dataset(builder, data_files={split: path}, cache_dir=cache_dir)[split]
    return raw


def max_model_length(tokenizer: transformers.PreTrainedTokenizerBase, config: transformers.PretrainedConfig) -> int:
    """The longest sequence both the tokenizer and the model's position table take (the table less the first
    position id, as the model's stage plan says: RoBERTa's positions start after the padding index)."""
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions:
        positions -= optimum_ipu.position_offset(config)
    return min(tokenizer.model_max_length, positions or tokenizer.model_max_length)


def _offline_errors() -> tuple[type[BaseException], ...]:
    """What `datasets` and `huggingface_hub` raise when the Hub cannot be reached (offline mode, no network, a
    timeout), and nothing else: a misspelt name or a missing config name is reported as it is."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]  # datasets: "Couldn't reach ... on the Hub"
    from huggingface_hub import errors as hub_errors

    errors += [getattr(hub_errors, name) for name in ("OfflineModeIsEnabled", "LocalEntryNotFoundError")]
    for module, name in (("httpx", "TransportError"), ("requests.exceptions", "ConnectionError")):
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            errors.append(getattr(importlib.import_module(module), name))
    return tuple(errors)


class HubUnreachableError(ConnectionError):
    """A dataset or model the run needs is neither in the local cache nor reachable on the Hugging Face Hub."""


def load_hub_dataset(
    name: str, config_name: str | None = None, *, local_files_hint: str, **kwargs: Any
) -> datasets.DatasetDict:
    """
    `datasets.load_dataset(name, config_name, **kwargs)`; when the Hub cannot be reached, one message for the user
    with a network and for the one without.

    Args:
        name (`str`): Dataset id on the Hub (or a local dataset folder, read without the Hub).
        config_name (`str`, *optional*): Its configuration.
        local_files_hint (`str`): The script's flags for local files, e.g. `"--train_file train.json
            --validation_file dev.json (SQuAD's JSON layout)"`.
        kwargs: Passed to `datasets.load_dataset` (`cache_dir`, `token`, `split`, ...).

    Raises:
        `HubUnreachableError`: offline or without a network, the dataset not being in the local cache. Every other
            error (a misspelt name, a missing config name) is raised as `datasets` raises it.
    """
    try:
        return datasets.load_dataset(name, config_name, **kwargs)
    except _offline_errors() as err:
        which = f"{name} ({config_name})" if config_name else name
        offline = any(os.environ.get(v, "0").upper() in ("1", "ON", "YES", "TRUE") for v in _OFFLINE_VARIABLES)
        online_fix = (
            f"unset {' and '.join(_OFFLINE_VARIABLES)} to download it"
            if offline
            else "check the network (and --token for a gated or private dataset)"
        )
        raise HubUnreachableError(
            f"--dataset_name {which}: not in the local datasets cache and the Hugging Face Hub could not be reached "
            f"({type(err).__name__}). With a network: {online_fix}. Without one: pass local files instead, "
            f"{local_files_hint}"
        ) from None


_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def train(
    trainer: Any,
    training_args: Any,
    last_checkpoint: str | None,
    num_samples: int,
    extra_metrics: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> bool:
    """
    Trains (resuming from `--resume_from_checkpoint` or the output folder's last checkpoint), saves the model and
    the trainer state, and logs and saves the `train_*` metrics with `train_samples` and, when given,
    `extra_metrics(metrics)` (figures derived from the run's, e.g. features per second of packed rows).

    Returns:
        `bool`: `False` when `--compile_only` compiled the graphs and nothing was trained or saved.
    """
    checkpoint = training_args.resume_from_checkpoint or last_checkpoint
    result = trainer.train(resume_from_checkpoint=checkpoint)
    if training_args.compile_only:
        logger.info("--compile_only: graphs compiled and cached; nothing trained or saved")
        return False
    trainer.save_model()  # the tokenizer / processor and ipu_config.json too
    metrics = {**result.metrics, "train_samples": num_samples}
    if extra_metrics is not None:
        metrics.update(extra_metrics(metrics))
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return True


def evaluate(
    trainer: Any,
    num_samples: int,
    extra_metrics: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """`trainer.evaluate(**kwargs)`, with `eval_samples` and `extra_metrics(metrics)` (e.g. perplexity), logged and
    saved (`eval_results.json`)."""
    logger.info("*** Evaluate ***")
    metrics = {**trainer.evaluate(**kwargs), "eval_samples": num_samples}
    if extra_metrics is not None:
        metrics.update(extra_metrics(metrics))
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


def predict(trainer: Any, dataset: Any, num_samples: int, *args: Any, **kwargs: Any) -> Any:
    """`trainer.predict(dataset, *args, **kwargs)`; its metrics, with `predict_samples`, logged and saved."""
    logger.info("*** Predict ***")
    results = trainer.predict(dataset, *args, **kwargs)
    results.metrics["predict_samples"] = num_samples
    trainer.log_metrics("predict", results.metrics)
    trainer.save_metrics("predict", results.metrics)
    return results


def write_class_predictions(trainer: Any, dataset: Any, class_name: Callable[[int], Any]) -> None:
    """`predict` over the test split (`predict_results.json`, with its loss and metrics when it has labels), then
    `predictions.txt` in the output folder: `index\tprediction`, each example's top class as `class_name(id)` gives it
    (a label name, or the id), on the main process."""
    results = predict(trainer, dataset, len(dataset), metric_key_prefix="predict")
    scores = results.predictions[0] if isinstance(results.predictions, tuple) else results.predictions
    if not trainer.is_world_process_zero():
        return
    path = os.path.join(trainer.args.output_dir, "predictions.txt")
    with open(path, "w", encoding="utf-8") as writer:
        writer.write("index\tprediction\n")
        for index, item in enumerate(np.argmax(scores, axis=-1)):
            writer.write(f"{index}\t{class_name(int(item))}\n")
    logger.info("Predictions written to %s", path)


def finish(trainer: Any, training_args: Any, model_args: Any = None, data_args: Any = None) -> Path | None:
    """
    The end of every script, as upstream's: a model card in `output_dir` (`README.md`: fine-tuned from which model,
    on which dataset, with the training arguments and results), or with `--push_to_hub` the model, its
    `ipu_config.json` and the card pushed to the Hub; then `training_curves.png` (loss, learning rate, evaluation
    metrics) beside `all_results.json` after a training run, on the main process (`optimum-ipu plot OUTPUT_DIR`
    draws it again from `trainer_state.json`).

    Returns:
        The picture's path, or `None` (no training, not the main process, or matplotlib missing: a warning says so).
    """
    if training_args.do_train and not training_args.compile_only:
        card = model_card_fields(model_args, data_args)
        if training_args.push_to_hub:
            trainer.push_to_hub(**card)
        else:
            trainer.create_model_card(**card)
    if not training_args.do_train or training_args.compile_only or not trainer.is_world_process_zero():
        return None
    if importlib.util.find_spec("matplotlib") is None:
        logger.warning(
            "training_curves.png not drawn: matplotlib is not installed (pip install 'optimum-ipu[examples]')"
        )
        return None
    from optimum_ipu.cli.plot import CURVES_FILE, plot_training_curves

    path = plot_training_curves(trainer.state.log_history, Path(training_args.output_dir) / CURVES_FILE)
    if path is not None:
        logger.info("Training curves drawn in %s", path)
    return path


def model_card_fields(model_args: Any, data_args: Any) -> dict[str, Any]:
    """What upstream's scripts put in the model card: the model fine-tuned from, and the dataset with its config."""
    card: dict[str, Any] = {}
    source = getattr(model_args, "model_name_or_path", None)
    if source:
        card["finetuned_from"] = source
    name, config = getattr(data_args, "dataset_name", None), getattr(data_args, "dataset_config_name", None)
    if name:
        card["dataset_tags"] = name
        card["dataset"] = f"{name} {config}" if config else name
        if config:
            card["dataset_args"] = config
    return card


def tokenize_split(
    raw: Mapping[str, datasets.Dataset],
    split: str,
    function: Callable[..., dict],
    training_args: Any,
    data_args: Any,
    limit: int | None = None,
    flag: str | None = None,
) -> datasets.Dataset:
    """
    The first `limit` examples of `raw[split]` through `function` (batched `Dataset.map`, the original columns
    dropped), tokenized on the main process first so the others read its cache.

    Args:
        raw: The raw splits.
        split (`str`): `train`, `validation` or `test`.
        function (`Callable`): The batched preprocessing function.
        training_args: The training arguments (`main_process_first`).
        data_args: The data arguments (`preprocessing_num_workers`, `overwrite_cache`).
        limit (`int`, *optional*): `--max_*_samples`.
        flag (`str`, *optional*): The flag that needs the split, for the error when it is missing (`--do_eval`).

    Raises:
        `ValueError`: if the split is missing.
    """
    if split not in raw:
        raise ValueError(
            f"{flag or '--do_' + split} needs a {split} dataset: give --{split}_file or a --dataset_name with it"
        )
    examples = raw[split]
    if limit is not None:
        examples = examples.select(range(min(limit, len(examples))))
    with training_args.main_process_first(desc=f"tokenize {split}"):
        return examples.map(
            function,
            batched=True,
            num_proc=getattr(data_args, "preprocessing_num_workers", None),
            remove_columns=examples.column_names,
            load_from_cache_file=not getattr(data_args, "overwrite_cache", False),
            desc=f"Running tokenizer on {split}",
        )


# the figures a closing summary shows, in this order, when the run has them
SUMMARY_KEYS = (
    ("eval_exact_match", "exact match (EM)"),
    ("eval_exact", "exact match (EM)"),
    ("eval_f1", "F1"),
    ("eval_accuracy", "accuracy"),
    ("eval_bleu", "BLEU"),
    ("eval_rougeLsum", "ROUGE-Lsum"),
    ("eval_loss", "evaluation loss"),
    ("train_loss", "training loss"),
    ("train_features_per_second", "training features / s"),
    ("train_samples_per_second", "training samples / s"),
    ("train_runtime", "training time (s)"),
)


def run_summary(output_dir: str | os.PathLike) -> str:
    """
    A few closing lines on a finished run: its main figures from `all_results.json` and where its outputs are.

    Raises:
        `FileNotFoundError`: if the folder has no `all_results.json` (the run did not finish).
    """
    folder = Path(output_dir).resolve()
    results_file = folder / "all_results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"{folder}: no all_results.json; the run did not finish (see its log)")
    results = json.loads(results_file.read_text(encoding="utf-8"))
    shown, lines = set(), [f"Run in {folder}:"]
    for key, label in SUMMARY_KEYS:
        if key in results and label not in shown:
            shown.add(label)
            value = results[key]
            lines.append(f"  {label:<24} {value:.2f}" if isinstance(value, float) else f"  {label:<24} {value}")
    outputs = [
        ("metrics", "all_results.json"),
        ("training curves", "training_curves.png"),
        ("predictions", "eval_predictions.json"),
        ("model", "model.safetensors"),
        ("LoRA adapters", "adapter_model.safetensors"),  # --use_peft
        ("IPU config", "ipu_config.json"),
    ]
    for label, name in outputs:
        if (folder / name).is_file():
            lines.append(f"  {label:<24} {folder / name}")
    return "\n".join(lines)
