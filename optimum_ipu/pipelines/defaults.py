"""What `pipeline()` does without a task or without a model, as Optimum Graphcore's `pipeline()` did.

- `pipeline(model=...)` without a task: for a Hub id, online, the Hub's `pipeline_tag` of the model (what
  `transformers.pipelines.get_task` reads for `transformers.pipeline` and Optimum Graphcore; read here with
  `huggingface_hub.model_info`, because `get_task` refuses the tags of the tasks `transformers` 5 removed:
  question answering, summarization, translation, text-to-text generation); for a model folder, a
  model object, or offline (where `transformers` cannot infer a task at all), the task whose `transformers` auto
  class maps the class the config names (`config.architectures`, or the object's class), in the order of
  `SUPPORTED_TASKS`: a `...ForSequenceClassification` is `"text-classification"` (not zero-shot), a
  `...ForConditionalGeneration` of text is `"text2text-generation"`.
- `pipeline(task)` without a model: Optimum Graphcore's default checkpoint of the task, at its pinned revision, with
  its IPU config (`TASK_DEFAULTS`), downloaded once by `from_pretrained`. Offline (`HF_HUB_OFFLINE=1`), one error
  naming that checkpoint and the fix.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import huggingface_hub
import transformers
from huggingface_hub import constants, try_to_load_from_cache
from torch import nn

from ..models.pipelined import PipelinedModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskDefault:
    """The checkpoint `pipeline(task)` loads when no model is given.

    Args:
        model (`str`): its Hub id.
        revision (`str`): the commit it is pinned to.
        ipu_config (`str` or `dict`): its IPU config: a bundled id or the fields of one.
    """

    model: str
    revision: str
    ipu_config: str | dict = field(default_factory=dict)


# Optimum Graphcore's defaults (`optimum/graphcore/pipelines/__init__.py`, SUPPORTED_TASKS[task]["default"]), kept
# as they were so that code written for it loads the same checkpoints. Hub ids that moved since redirect.
TASK_DEFAULTS: dict[str, TaskDefault] = {
    "audio-classification": TaskDefault("superb/hubert-base-superb-ks", "d7e0efe", "Graphcore/hubert-base-ipu"),
    "automatic-speech-recognition": TaskDefault(
        "facebook/wav2vec2-base-960h", "55bb623", "Graphcore/wav2vec2-ctc-base-ipu"
    ),
    "fill-mask": TaskDefault("distilroberta-base", "ec58a5b", "Graphcore/distilroberta-base-ipu"),
    "image-classification": TaskDefault("google/vit-base-patch16-224", "5dca96d", "Graphcore/vit-base-ipu"),
    "question-answering": TaskDefault(
        "distilbert-base-cased-distilled-squad", "626af31", "Graphcore/distilbert-base-ipu"
    ),
    "text-classification": TaskDefault(
        "distilbert-base-uncased-finetuned-sst-2-english", "af0f99b", "Graphcore/distilbert-base-ipu"
    ),
    "token-classification": TaskDefault(
        "dbmdz/bert-large-cased-finetuned-conll03-english", "f2482bf", "Graphcore/bert-large-ipu"
    ),
    "text-generation": TaskDefault("gpt2", "e7da7f2", {}),
    "summarization": TaskDefault("ainize/bart-base-cnn", "b90bc9a", {"ipus_per_replica": 2}),
    "translation": TaskDefault("t5-small", "9507060", {"ipus_per_replica": 2}),
    "text2text-generation": TaskDefault("t5-small", "9507060", {"ipus_per_replica": 2}),
    "zero-shot-classification": TaskDefault("roberta-large-mnli", "130fb28", "Graphcore/roberta-large-ipu"),
}


# (the Hub tags sentence-transformers models "sentence-similarity": their embeddings)
TASK_ALIASES = {
    "sentiment-analysis": "text-classification",
    "ner": "token-classification",
    "sentence-similarity": "sentence-embeddings",
}


class NoDefaultModelOfflineError(ValueError):
    """`pipeline(task)` was given no model, and the task's default checkpoint cannot be downloaded offline."""


def hub_offline() -> bool:
    """Whether the Hugging Face Hub is off limits (`HF_HUB_OFFLINE=1`), as `huggingface_hub` reads it."""
    return constants.is_offline_mode()


def _in_hub_cache(repo_id: str, revision: str) -> bool:
    """Whether the Hub cache holds `repo_id` at `revision` (offline, `transformers` loads it from there)."""
    return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)


def default_model(task: str, ipu_config: Any, model_kwargs: dict[str, Any] | None) -> tuple[str, Any, dict[str, Any]]:
    """`(model id, IPU config, model_kwargs)` of `pipeline(task)` without a model: Optimum Graphcore's default
    checkpoint at its pinned revision (unless `model_kwargs` names another) and its IPU config (unless one is given).

    Raises:
        `NoDefaultModelOfflineError`: offline, with the checkpoint not in the Hub cache; the message names the
        checkpoint it would download and the fix.
    """
    name = "translation" if task.startswith("translation") else task
    default = TASK_DEFAULTS.get(name)
    if default is None:  # a task Optimum Graphcore's pipeline() did not have (feature-extraction, ...): no default
        raise ValueError(f"pipeline({task!r}) has no default model; pass model= a model folder, Hub id or object")
    if hub_offline() and not _in_hub_cache(default.model, default.revision):
        raise NoDefaultModelOfflineError(
            f"pipeline({task!r}) without a model would download Optimum Graphcore's default for the task, "
            f"{default.model} (revision {default.revision}), and HF_HUB_OFFLINE=1 forbids it: pass model= a local "
            "model folder (or a model object), or unset HF_HUB_OFFLINE to download it"
        )
    logger.warning(
        "No model was supplied, defaulted to %s and revision %s (Optimum Graphcore's default for %s). Using a "
        "pipeline without specifying a model name and revision in production is not recommended.",
        default.model,
        default.revision,
        task,
    )
    kwargs = {"revision": default.revision, **(model_kwargs or {})}
    return default.model, default.ipu_config if ipu_config is None else ipu_config, kwargs


def _class_names(model: Any, model_kwargs: dict[str, Any] | None) -> tuple[str, list[str]]:
    """`(model type, class names)` the model's config or object names."""
    if isinstance(model, nn.Module):
        stock = model.model if isinstance(model, PipelinedModel) else model
        return stock.config.model_type, [type(stock).__name__]
    hub = {k: v for k, v in (model_kwargs or {}).items() if k in ("revision", "token", "cache_dir")}
    config = transformers.AutoConfig.from_pretrained(model, **hub)
    return config.model_type, list(getattr(config, "architectures", None) or [])


def _maps(mapping_names: str, model_type: str, class_name: str) -> bool:
    for name in mapping_names.split("|"):
        mapped = getattr(transformers.models.auto.modeling_auto, name).get(model_type)
        if class_name in ((mapped,) if isinstance(mapped, str) else tuple(mapped or ())):
            return True
    return False


def task_from_config(model: Any, supported: dict[str, Any], model_kwargs: dict[str, Any] | None = None) -> str:
    """The first task of `supported` (name -> spec with the pipeline class as `impl`) whose `transformers` auto
    class maps a class the model's config names (`architectures`) or the model object's class."""
    model_type, classes = _class_names(model, model_kwargs)
    for class_name in classes:
        for task, spec in supported.items():
            if _maps(spec.impl.model_mapping, model_type, class_name):
                return task
    what = f"names the classes {', '.join(classes)}" if classes else "names no class (no 'architectures')"
    raise ValueError(
        f"pipeline(model={model if isinstance(model, str) else type(model).__name__}): no task could be inferred: "
        f"its config {what}, which no supported task takes; pass the task, one of {', '.join(supported)}"
    )


def hub_task(model_id: str, token: str | None = None) -> str | None:
    """The Hub's `pipeline_tag` of a `transformers` model (aliases resolved), or None when there is none or the Hub
    cannot be reached (the task is then inferred from the config)."""
    try:
        info = huggingface_hub.model_info(model_id, token=token)
    except Exception as err:  # noqa: BLE001 (no network, an unknown id, a gated repo: the config may still tell)
        logger.info("the Hub gave no task for %s (%s): inferring it from its config", model_id, type(err).__name__)
        return None
    if getattr(info, "library_name", None) not in (None, "transformers"):
        return None
    return TASK_ALIASES.get(info.pipeline_tag, info.pipeline_tag)


def _is_sentence_transformers(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "modules.json"))


def infer_task(model: Any, supported: dict[str, Any], model_kwargs: dict[str, Any] | None = None) -> str:
    """The task of `pipeline(model=...)` given without one (see the module docstring), said once in the log."""
    if model is None:
        raise ValueError(
            "pipeline(): give a task, a model, or both (e.g. pipeline('text-classification'), "
            "pipeline(model='path/to/model'))"
        )
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    task = None
    if isinstance(model, str) and not os.path.isdir(model) and not hub_offline():
        task = hub_task(model, (model_kwargs or {}).get("token"))
        if task is not None and task not in supported:
            raise ValueError(
                f"pipeline(model={model!r}): the Hub says its task is {task!r}, which pipeline() does not run here; "
                f"pass a task, one of {', '.join(supported)}"
            )
    if task is None:
        task = task_from_config(model, supported, model_kwargs)
        if task == "feature-extraction" and isinstance(model, str) and _is_sentence_transformers(model):
            task = "sentence-embeddings"  # its modules.json says how its vectors are pooled: what it is for
    logger.warning("pipeline(): no task given; inferred %r for this model", task)
    return task
