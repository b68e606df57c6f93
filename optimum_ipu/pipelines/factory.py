"""`pipeline(task, model=..., ipu_config=...)`: `transformers.pipeline` for pipelined models at static shapes."""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass
from typing import Any

import transformers
from torch import nn

from ..config import IPUConfig
from ..errors import IncompatibleIPUConfigError, checked_bool
from ..files import model_folder_text_problem
from ..models.auto import repo_ipu_config
from ..models.pipelined import PipelinedModel
from ..models.stage_loading import loads_stage_only
from ..models.tensor_parallel import split_for_inference
from ..runtime.devices import default_device
from ..runtime.inference.runner import BACKENDS, resolve_backend
from .base import StaticBatchingPipeline, pipeline_device, resolve_ipu_config, resolve_precision, supported_classes
from .classification import (
    IPUFillMaskPipeline,
    IPUTextClassificationPipeline,
    IPUTokenClassificationPipeline,
    IPUZeroShotClassificationPipeline,
)
from .defaults import TASK_ALIASES, default_model, infer_task
from .embeddings import IPUFeatureExtractionPipeline, IPUSentenceEmbeddingsPipeline
from .generation import (
    IPUSummarizationPipeline,
    IPUText2TextGenerationPipeline,
    IPUTextGenerationPipeline,
    IPUTranslationPipeline,
)
from .processing import load_processors, processors_of
from .question_answering import IPUQuestionAnsweringPipeline
from .speech import IPUAudioClassificationPipeline, IPUAutomaticSpeechRecognitionPipeline
from .vision import IPUImageClassificationPipeline

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSpec:
    """A task of `pipeline()`: the class that runs it and the `transformers` auto class that loads its models."""

    impl: type[StaticBatchingPipeline]
    auto_class: str  # "A|B": the first whose mapping has the model's type (speech recognition: CTC or seq2seq)


SUPPORTED_TASKS: dict[str, TaskSpec] = {
    "text-classification": TaskSpec(IPUTextClassificationPipeline, "AutoModelForSequenceClassification"),
    "token-classification": TaskSpec(IPUTokenClassificationPipeline, "AutoModelForTokenClassification"),
    "question-answering": TaskSpec(IPUQuestionAnsweringPipeline, "AutoModelForQuestionAnswering"),
    "fill-mask": TaskSpec(IPUFillMaskPipeline, "AutoModelForMaskedLM"),
    "text-generation": TaskSpec(IPUTextGenerationPipeline, "AutoModelForCausalLM"),
    "text2text-generation": TaskSpec(IPUText2TextGenerationPipeline, "AutoModelForSeq2SeqLM"),
    "summarization": TaskSpec(IPUSummarizationPipeline, "AutoModelForSeq2SeqLM"),
    "translation": TaskSpec(IPUTranslationPipeline, "AutoModelForSeq2SeqLM"),
    "zero-shot-classification": TaskSpec(IPUZeroShotClassificationPipeline, "AutoModelForSequenceClassification"),
    "image-classification": TaskSpec(IPUImageClassificationPipeline, "AutoModelForImageClassification"),
    "audio-classification": TaskSpec(IPUAudioClassificationPipeline, "AutoModelForAudioClassification"),
    "automatic-speech-recognition": TaskSpec(
        IPUAutomaticSpeechRecognitionPipeline, "AutoModelForCTC|AutoModelForSpeechSeq2Seq"
    ),
    # last: a task is inferred from the first entry that maps the model's class, and a model with a head has a task
    # of its own before this one of its base model
    "feature-extraction": TaskSpec(IPUFeatureExtractionPipeline, "AutoModel"),
    # after feature-extraction: a bare base model is inferred as that (a sentence-transformers folder as this one)
    "sentence-embeddings": TaskSpec(IPUSentenceEmbeddingsPipeline, "AutoModel"),
}
# tasks run by `diffusers`' pipelines (the `[diffusers]` extra), not by a `StaticBatchingPipeline`
DIFFUSION_TASKS = ("text-to-image",)


def supported_tasks() -> list[str]:
    """Every task name `pipeline()` takes (aliases included; also `"translation_xx_to_yy"`)."""
    return sorted({*SUPPORTED_TASKS, *TASK_ALIASES})


def list_tasks() -> list[str]:
    """Optimum Graphcore's name of `supported_tasks()`: the task names and their aliases, sorted."""
    return supported_tasks()


def check_task(task: str) -> tuple[str, TaskSpec]:
    """The canonical task name and its spec; a clear error lists the known tasks and suggests the nearest."""
    if not isinstance(task, str) or not task:
        raise ValueError(f"task: got {task!r}; expected one of {', '.join(supported_tasks())}")
    name = TASK_ALIASES.get(task, task)
    if name in SUPPORTED_TASKS:
        return name, SUPPORTED_TASKS[name]
    parts = name.split("_")
    if len(parts) == 4 and parts[0] == "translation" and parts[2] == "to" and parts[1] and parts[3]:
        return name, SUPPORTED_TASKS["translation"]
    nearest = difflib.get_close_matches(task, supported_tasks(), n=1)
    hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
    raise KeyError(
        f"unknown task {task!r}{hint} Known tasks: {', '.join(supported_tasks())} (and 'translation_xx_to_yy')"
    )


def _check_config(task: str, spec: TaskSpec, path: str) -> None:
    """Refuse a model folder whose family has no registered class for the task, before its weights are read."""
    config = transformers.AutoConfig.from_pretrained(path)
    supported = supported_classes(spec.impl.model_mapping)
    mappings = [getattr(transformers.models.auto.modeling_auto, m) for m in spec.impl.model_mapping.split("|")]
    name = next((m[config.model_type] for m in mappings if config.model_type in m), None)
    if name not in supported:
        what = f"its class for this task would be {name}" if name else "transformers has no class of it for this task"
        raise IncompatibleIPUConfigError(
            f"{task}: {path} holds a {config.model_type!r} model and {what}, which has no stage plan here; "
            f"use a model of one of: {', '.join(supported)}"
        )


def _auto_class(spec: TaskSpec, path: str) -> type:
    """The `transformers` auto class of the task that maps the model folder's type."""
    names = spec.auto_class.split("|")
    if len(names) > 1:
        model_type = transformers.AutoConfig.from_pretrained(path).model_type
        for name in names:
            if model_type in getattr(transformers, name)._model_mapping._model_mapping:
                return getattr(transformers, name)
    return getattr(transformers, names[0])


def pipeline(
    task: str | None = None,
    model: str | os.PathLike | nn.Module | None = None,
    ipu_config: IPUConfig | str | dict | None = None,
    tokenizer: str | os.PathLike | transformers.PreTrainedTokenizerBase | None = None,
    feature_extractor: Any = None,
    *,
    max_seq_length: int | None = None,
    precision: str | None = None,
    fp16: bool | None = None,
    bf16: bool = False,
    batch_size: int = 1,
    device: Any = None,
    backend: str = "auto",
    buckets: list[int] | None = None,
    quantize: bool = False,
    model_kwargs: dict[str, Any] | None = None,
    pipeline_class: type[StaticBatchingPipeline] | None = None,
    config: str | os.PathLike | transformers.PretrainedConfig | None = None,
    **kwargs: Any,
) -> StaticBatchingPipeline:
    """Build a pipeline for `task` that runs `model` pipelined as `ipu_config` says, at static shapes.

    The arguments come in Optimum Graphcore's order: `pipeline(task, model, ipu_config, tokenizer,
    feature_extractor)`. Inputs are batched into host batches of a fixed number of rows, `batch_size x
    inference_device_iterations x inference_replication_factor` (the replicas run in turn in one process; under
    `torchrun`, each process takes its share), the last one filled with copies of a real row whose outputs are
    dropped; token inputs are padded to the smallest of a few sequence-length `buckets` that holds them (on ONNX
    Runtime, to their own length). The model runs in the config's inference layout (its `inference_*` values; the
    config given is not changed) with `backend`, in `precision`. Outputs are those of `transformers`' pipeline of
    the same task (its v4 formats for question answering, summarization, translation and text-to-text generation).

    For the lowest latency at batch 1, keep `backend="auto"`: on CPUs the model is exported once to ONNX and run by
    ONNX Runtime's fused graph at each request's own length (the export takes seconds the first time and is kept in
    the config's `executable_cache_dir`); on GPUs it is compiled per bucket with CUDA graphs, in fp16.

    Args:
        task (`str`, *optional*): `"text-classification"` (`"sentiment-analysis"`), `"token-classification"` (`"ner"`),
            `"question-answering"`, `"fill-mask"`, `"text-generation"`, `"text2text-generation"`,
            `"summarization"`, `"translation"` or `"translation_xx_to_yy"`, `"zero-shot-classification"`,
            `"image-classification"`, `"audio-classification"`, `"automatic-speech-recognition"` (CTC models and
            Whisper; see `optimum_ipu.pipelines.speech`), `"feature-extraction"` (token features, or sentence
            embeddings with `pooling="mean", normalize=True`; see `optimum_ipu.pipelines.embeddings`),
            `"text-to-image"` (a Stable Diffusion folder run by `diffusers`, the `[diffusers]` extra; its calls return
            the images; see `optimum_ipu.pipelines.diffusion`). Without it, the task is inferred from the model: a
            Hub id's `pipeline_tag` online, else the class its config names (`optimum_ipu.pipelines.defaults`).
        model (`str`, `os.PathLike` or `transformers.PreTrainedModel`, *optional*): a model folder or Hub id
            (downloaded once, then read from the local cache), loaded with the task's `transformers` auto class, or
            a model object (also a `PipelinedModel`). Without it, Optimum Graphcore's default checkpoint of the task
            (`TASK_DEFAULTS`, at its pinned revision, with its IPU config) is downloaded; offline
            (`HF_HUB_OFFLINE=1`), a `NoDefaultModelOfflineError` names it.
        tokenizer (`str`, `os.PathLike` or tokenizer, *optional*): defaults to the model folder's tokenizer. Image
            and audio tasks load the folder's image processor / feature extractor instead (or take them as
            `image_processor=` / `feature_extractor=`).
        feature_extractor (*optional*): the audio tasks' feature extractor (a folder or an object), as Optimum
            Graphcore's fifth argument.
        ipu_config (`IPUConfig`, `str` or `dict`, *optional*): a config, a folder / JSON file / bundled id such as
            `"Graphcore/bert-base-ipu"`, or a dict of fields. Defaults to the model folder's `ipu_config.json`,
            else `IPUConfig()` (one stage, one replica). The third positional argument, as in Optimum Graphcore;
            a config object is copied, never changed.
        max_seq_length (`int`, *optional*): tokens every input is padded to: 128 by default (question answering:
            384, its windows; text generation: 64 prompt tokens), at most the model's positions.
        precision (`str`, *optional*): `"fp32"`, `"fp16"` or `"bf16"` (autocast); `fp16=True` / `bf16=True` say
            the same, `fp16=False` fp32. By default fp16 on accelerators (Optimum Graphcore's `fp16=True`) and fp32
            on CPUs, where half precision is slower.
        batch_size (`int`, *optional*, defaults to 1): rows per device in a host batch.
        device (*optional*): defaults to this process's GPU, else the CPU.
        backend (`str`, *optional*, defaults to `"auto"`): `"eager"`, `"compile"` (`torch.compile`, one graph per
            bucket; CUDA graphs on GPUs) or `"onnxruntime"` (the `[onnx]` extra); `"auto"`: ONNX Runtime on CPUs,
            `"compile"` on GPUs, for token inputs. Text generation runs `"eager"` or `"compile"` (its decoding
            steps through `torch.compile`, on CPUs too: 0.78-0.83x the eager steps' time for a 124 M GPT-2; the
            first calls at 1 and at 2+ rows compile); `"auto"` is `"compile"` on GPUs, `"eager"` on CPUs; the
            other generation tasks run `"eager"`.
        buckets (`list[int]`, *optional*): the sequence lengths inputs are padded to, the last `max_seq_length`
            (at most 8; default `optimum_ipu.runtime.inference.runner.default_buckets`, e.g. 64, 128, ..., 384).
        quantize (`bool`, *optional*, defaults to `False`): int8 weights, not exact: ONNX Runtime's on its backend
            (faster on CPUs); otherwise the model's linear weights in int8 per group by torchao (the `[quantization]`
            extra).
        model_kwargs (`dict`, *optional*): passed to `from_pretrained` when `model` is a path.
        pipeline_class (*optional*): a subclass of the task's class to use instead.
        config (`str`, `os.PathLike` or `transformers.PretrainedConfig`, *optional*): the model's config (an id, a
            folder or a config object) when `model` is a path, as `transformers.pipeline(config=...)`; not used with
            a model object (neither does `transformers`).
        kwargs: the task's own parameters, used as defaults of every call (e.g. `top_k`, `num_beams`,
            `max_new_tokens`, `aggregation_strategy`, `src_lang` / `tgt_lang`).

    Example:

    ```python
    >>> from optimum_ipu.pipelines import pipeline
    >>> qa = pipeline("question-answering", model="path/to/bert-squad", ipu_config="Graphcore/bert-base-ipu")
    >>> qa(question="Who commanded the ship?", context="The ship was commanded by Captain Hartwell.")
    {'score': 0.97, 'start': 26, 'end': 42, 'answer': 'Captain Hartwell'}
    ```
    """
    # a truthy string ("false") must not switch an option on
    quantize, bf16 = checked_bool("quantize", quantize), checked_bool("bf16", bf16)
    fp16 = checked_bool("fp16", fp16, allow_none=True)
    device = pipeline_device(device)  # a device this machine lacks is said before any model is loaded
    for name, folder in (("model", model), ("tokenizer", tokenizer)):
        problem = model_folder_text_problem(folder) if isinstance(folder, (str, os.PathLike)) else None
        if problem is not None:  # transformers would say "not a valid JSON file", or read a BOM into a token
            raise ValueError(f"pipeline({name}={os.fspath(folder)!r}): {problem}")
    if task is None:
        task = infer_task(model, SUPPORTED_TASKS, model_kwargs)
    if task in DIFFUSION_TASKS:  # diffusers' pipelines, not transformers' (optimum_ipu.pipelines.diffusion)
        from .diffusion import text_to_image_pipeline  # needs diffusers: imported for this task only

        fixed = {"tokenizer": tokenizer, "feature_extractor": feature_extractor, "max_seq_length": max_seq_length}
        fixed.update(buckets=buckets, pipeline_class=pipeline_class, quantize=quantize or None)
        fixed.update(batch_size=None if batch_size == 1 else batch_size, backend=None if backend == "auto" else backend)
        refused = tuple(name for name, value in fixed.items() if value is not None)
        precision = resolve_precision(precision, fp16=fp16, bf16=bf16)
        return text_to_image_pipeline(
            model, ipu_config, precision=precision, device=device, model_kwargs=model_kwargs, refused=refused, **kwargs
        )
    task, spec = check_task(task)
    # a backend the task cannot run is said before any model is loaded (the runner checks again, with its inputs)
    resolve_backend(backend, device or default_device(), getattr(pipeline_class or spec.impl, "backends", BACKENDS))
    if model is None:
        model, ipu_config, model_kwargs = default_model(task, ipu_config, model_kwargs)
    precision = resolve_precision(precision, fp16=fp16, bf16=bf16)
    if config is not None and isinstance(model, (str, os.PathLike)):  # transformers' `pipeline(config=...)`
        if not isinstance(config, transformers.PretrainedConfig):
            config = transformers.AutoConfig.from_pretrained(config)
        model_kwargs = {**(model_kwargs or {}), "config": config}
    if isinstance(feature_extractor, (str, os.PathLike)):
        kwargs.update(load_processors(os.fspath(feature_extractor), ("feature_extractor",), {}))
    elif feature_extractor is not None:
        kwargs["feature_extractor"] = feature_extractor
    if isinstance(ipu_config, transformers.PreTrainedTokenizerBase):
        raise TypeError(
            "ipu_config: got a tokenizer; the third positional argument is the IPU config (Optimum Graphcore's "
            "order: pipeline(task, model, ipu_config, tokenizer)); pass it as tokenizer="
        )
    # the processors of the model's own repository at the model's revision (a default checkpoint's pinned one)
    revision = (model_kwargs or {}).get("revision") if tokenizer is None and isinstance(model, str) else None
    model, ipu_config, tokenizer = _load_model(task, spec, model, ipu_config, tokenizer, model_kwargs)
    tokenizer = _load_processors(task, spec, model, tokenizer, kwargs, revision)
    if not isinstance(model, PipelinedModel):
        ipu_config = resolve_ipu_config(ipu_config)
    split_for_inference(model, model.ipu_config if isinstance(model, PipelinedModel) else ipu_config)
    cls = pipeline_class or spec.impl
    if not issubclass(cls, spec.impl):
        raise TypeError(f"pipeline_class: {cls.__name__} is not a subclass of {spec.impl.__name__}, which runs {task}")
    return cls(
        model=model,
        tokenizer=tokenizer,
        task=task,
        ipu_config=ipu_config,
        max_seq_length=max_seq_length,
        precision=precision,
        batch_size=batch_size,
        device=device,
        backend=backend,
        buckets=buckets,
        quantize=quantize,
        **kwargs,
    )


def _load_model(
    task: str, spec: TaskSpec, model: Any, ipu_config: Any, tokenizer: Any, model_kwargs: dict[str, Any] | None
) -> tuple[nn.Module, Any, Any]:
    """The model object of `pipeline(model=...)` (loaded with the task's auto class from a folder or cached id), the
    IPU config (a model folder's `ipu_config.json` when none is given) and the tokenizer source (the folder)."""
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if isinstance(model, str):
        if ipu_config is None:  # trained with IPUTrainer: its ipu_config.json sits beside the weights (or on the Hub)
            ipu_config = repo_ipu_config(model, **(model_kwargs or {}))
        _check_config(task, spec, model)
        if tokenizer is None:
            tokenizer = model
        config = resolve_ipu_config(ipu_config)
        if loads_stage_only(config):  # torchrun, several stages: this process reads its stage only
            from ..models.stage_loading import load_stage  # the process mesh: only when loading so
            from ..runtime.distributed import join_process_group

            join_process_group()
            model = load_stage(_auto_class(spec, model), model, config, **(model_kwargs or {}))
            return model, None, tokenizer  # the pipelined model carries its config
        model = _auto_class(spec, model).from_pretrained(model, **(model_kwargs or {}))
    elif not isinstance(model, nn.Module):
        raise TypeError(f"model: got a {type(model).__name__}; pass a model folder or a transformers model")
    elif model_kwargs:
        raise ValueError("model_kwargs apply when the model is loaded from a path; this model is already built")
    return model, ipu_config, tokenizer


def _load_processors(
    task: str, spec: TaskSpec, model: nn.Module, tokenizer: Any, kwargs: dict[str, Any], revision: str | None = None
) -> Any:
    """The tokenizer object (None for a task without one); the folder's image processor or feature extractor go into
    `kwargs` (a model object without a tokenizer reads them from the folder it was loaded from)."""
    needed = processors_of(spec.impl)
    others_given = all(kwargs.get(name) is not None for name in needed if name != "tokenizer")
    if tokenizer is None and ("tokenizer" in needed or not others_given):
        stock = model.model if isinstance(model, PipelinedModel) else model
        source = getattr(stock.config, "_name_or_path", "") or getattr(stock, "name_or_path", "")
        if not (source and os.path.isdir(source)):
            raise ValueError(f"pipeline({task!r}): the model object has no tokenizer folder; pass tokenizer=")
        tokenizer = source
    if isinstance(tokenizer, (str, os.PathLike)):  # the folder's tokenizer, image processor or feature extractor
        kwargs.update(load_processors(os.fspath(tokenizer), needed, kwargs, revision))
        tokenizer = kwargs.pop("tokenizer", None)
    return tokenizer
