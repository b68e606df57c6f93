"""Static batching for `transformers` pipelines: fixed batch and sequence sizes, the model run by the engine.

A pipeline of this package is a `transformers` pipeline class (or one written here for the tasks `transformers` 5
removed) combined with `StaticBatchingPipeline`, which replaces how inputs travel to the model:

- every batch of token inputs is padded to a sequence-length bucket: the smallest of a small fixed set of lengths
  up to `max_seq_length` that holds its longest input (with the tokenizer's padding values and side), or, on ONNX
  Runtime, to that longest input itself (dynamic shapes; see `optimum_ipu.runtime.inference.runner`);
- inputs are grouped in host batches of a fixed number of rows: the per-device `batch_size` x the config's
  `inference_device_iterations` x the `inference_replication_factor` replicas this process runs (all of them in one
  process); the last batch is filled with copies of its last row, whose outputs are dropped;
- the model runs in its inference layout (the config's `inference_*` values, read without changing the caller's
  config) with the chosen backend: the engine (`Engine.eval_step`, `inference_device_iterations` batches per host
  call, autocast in the chosen precision), eagerly or through `torch.compile` (one graph per bucket), or the
  exported graph on ONNX Runtime (`backend=`, chosen per device by default).

So calls take few shapes (one compiled graph per bucket), while the task's own pre- and post-processing stay those
of `transformers`, and outputs equal `transformers`' pipeline on the same model and inputs.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import types
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import Pipeline, PreTrainedModel
from transformers.utils.chat_template_utils import Chat, is_valid_message

from ..config import IPUConfig
from ..errors import IncompatibleIPUConfigError
from ..models.pipelined import PipelinedModel, to_pipelined
from ..models.plans import position_offset, registered_classes
from ..runtime.devices import check_device
from ..runtime.inference.runner import BACKENDS, InferenceRunner
from ..runtime.precision import PRECISIONS

logger = logging.getLogger(__name__)

# Padding values of `transformers`' own batching (`pipelines.base.pad_collate_fn`): masks of "not a real token" pad
# with 1, everything else but the ids with 0.
_PAD_WITH_ONE = ("special_tokens_mask", "p_mask")


def resolve_ipu_config(ipu_config: IPUConfig | str | dict | None) -> IPUConfig:
    """An `IPUConfig` from a config (copied: its mode is switched to inference here), a folder / JSON file / bundled
    id such as `"Graphcore/bert-base-ipu"`, a dict of fields, or `None` (one stage, one replica)."""
    if ipu_config is None:
        return IPUConfig()
    if isinstance(ipu_config, IPUConfig):
        return ipu_config.copy()
    if isinstance(ipu_config, dict):
        return IPUConfig.from_dict(ipu_config)
    if isinstance(ipu_config, str):
        return IPUConfig.from_pretrained(ipu_config)
    raise TypeError(
        f"ipu_config: got a {type(ipu_config).__name__}; pass an IPUConfig, a dict of its fields, or a folder, JSON "
        "file or bundled id (e.g. 'Graphcore/bert-base-ipu')"
    )


def resolve_precision(precision: str | None = None, fp16: bool | None = None, bf16: bool = False) -> str | None:
    """`"fp32"`, `"fp16"` or `"bf16"` from `precision` or the `fp16` / `bf16` flags; `fp16=False` alone means fp32.
    `None` when nothing is given: the device's default (fp16 on accelerators, fp32 on CPUs; see
    `optimum_ipu.runtime.inference.runner.default_precision`)."""
    if fp16 and bf16:
        raise ValueError("fp16=True and bf16=True: choose one half precision")
    flag = "fp16" if fp16 else "bf16" if bf16 else None
    if precision is not None and flag is not None and precision != flag:
        raise ValueError(f"precision={precision!r} contradicts {flag}=True; give only one of them")
    precision = precision or flag or ("fp32" if fp16 is False else None)
    if precision is None:
        return None
    if precision not in PRECISIONS:
        raise ValueError(f"precision: got {precision!r}; expected one of {', '.join(PRECISIONS)}")
    return precision


def position_limit(config: Any) -> int | None:
    """The longest sequence a model's absolute position table takes (None: no table, e.g. T5's relative ones)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            # RoBERTa numbers positions from pad_token_id + 1: its table holds that many fewer tokens.
            return value - position_offset(config)
    return None


class _Owner:
    """The model inputs one pipeline input turned into, and the model outputs collected for them."""

    __slots__ = ("expected", "outputs")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.outputs: list[dict[str, Any]] = []

    @property
    def done(self) -> bool:
        return len(self.outputs) == self.expected


class StaticBatchingPipeline(Pipeline):
    """Runs a `transformers` pipeline at static shapes on a pipelined model. Use it after the task's class:
    `class IPUFillMaskPipeline(FillMaskPipeline, StaticBatchingPipeline)`, so that the task's `__call__` reaches
    this class's batching in place of `Pipeline.__call__`.

    Args:
        model (`transformers.PreTrainedModel` or `PipelinedModel`): a model of a registered class.
        ipu_config (`IPUConfig`, `str` or `dict`, *optional*): the execution configuration (see
            `resolve_ipu_config`); its `inference_*` values apply. Defaults to one stage and one replica.
        max_seq_length (`int`, *optional*): tokens every model input is padded to (the class's
            `default_max_seq_length`, capped by the model's position table, when not given). A longer input is
            an error that names it.
        precision (`str`, *optional*): `"fp32"`, `"fp16"` or `"bf16"` (autocast); by default fp16 on accelerators
            (as Optimum Graphcore), fp32 on CPUs.
        device (`int`, `str` or `torch.device`, *optional*): defaults to this process's GPU, else the CPU.
        backend (`str`, *optional*, defaults to `"auto"`): what runs the forward: `"eager"`, `"compile"`
            (`torch.compile`, one graph per bucket, CUDA graphs on GPUs) or `"onnxruntime"` (the exported, fused
            graph at each batch's own length); `"auto"` takes ONNX Runtime on CPUs and `"compile"` on GPUs (for the
            tasks whose inputs are tokens; the others run `"eager"` / `"compile"`).
        buckets (`list[int]`, *optional*): the sequence lengths token inputs are padded to (the last must be
            `max_seq_length`; at most 8); by default the config's `inference_parallelize_kwargs["sequence_buckets"]`,
            else about six (`default_buckets`); `[max_seq_length]` pads every input to the static length.
        quantize (`bool`, *optional*, defaults to `False`): int8 weights, not exact: ONNX Runtime's (faster on CPUs);
            on `"eager"` / `"compile"` (generation and speech run there), the linear weights of the model's layers in
            int8 per group by torchao (the `[quantization]` extra; the model given is quantized in place), as Optimum
            Graphcore's `use_group_quantized_linears`, which the config's `inference_parallelize_kwargs` may set too.
        batch_size (`int`, *optional*, defaults to 1): rows per device; a host batch holds `batch_size x
            inference_device_iterations x inference_replication_factor` rows (the replicas of this process).
        kwargs: the task pipeline's own arguments (`tokenizer`, `task`, default call parameters).
    """

    default_max_seq_length: int = 128
    # The `transformers` auto mapping of the models this task runs (checked against the registered classes).
    model_mapping: str = ""
    # Generation pads the rows itself (`generate_static`); the other tasks' batches are filled here.
    pads_rows: bool = True
    # The task's `preprocess` yields several model inputs per pipeline input, all passed to one `postprocess`.
    chunked: bool = False
    # The backends this task can feed (`runtime.inference.runner.BACKENDS`); ONNX Runtime takes token inputs only.
    backends: tuple[str, ...] = BACKENDS
    # Token inputs are padded to a bucket (or their own length); False: always to `max_seq_length`.
    bucketed: bool = True
    # The task's `_forward` / `postprocess` read numpy arrays as well as tensors: ONNX Runtime's outputs stay arrays.
    array_outputs: bool = False

    def __init__(
        self,
        model: PreTrainedModel | PipelinedModel,
        *args: Any,
        ipu_config: IPUConfig | str | dict | None = None,
        max_seq_length: int | None = None,
        precision: str | None = None,
        device: int | str | torch.device | None = None,
        backend: str = "auto",
        buckets: list[int] | None = None,
        quantize: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: got a {type(model).__name__}; pass a transformers model (or a path to pipeline())")
        if self.model_mapping:
            check_model_class(model, kwargs.get("task") or type(self).__name__, self.model_mapping)
        if isinstance(model, PipelinedModel):
            if ipu_config is not None and ipu_config is not model.ipu_config:
                raise ValueError(
                    "ipu_config: the model is already pipelined with its own config; pass one or the other"
                )
            pipelined = model
        else:
            # A copy of the caller's config; the model in eval mode first: it selects the inference layout.
            pipelined = to_pipelined(model.eval(), resolve_ipu_config(ipu_config), parallelize=True)
        pipelined.eval().parallelize()  # (a no-op for a model already parallelized)
        self.pipelined = pipelined
        self.ipu_config: IPUConfig = pipelined.ipu_config
        self.max_seq_length = self._resolve_max_seq_length(pipelined.model.config, max_seq_length)
        knobs = self.ipu_config.value("parallelize_kwargs", inference=True)
        quantize = quantize or bool(knobs.get("use_group_quantized_linears"))
        self.runner = InferenceRunner(
            pipelined,
            self.ipu_config,
            backend=backend,
            precision=resolve_precision(precision),
            device=pipeline_device(device),
            buckets=self._buckets(buckets),
            max_seq_length=self.max_seq_length,
            input_names=_token_inputs(pipelined.model, kwargs.get("tokenizer")) if self.bucketed else None,
            supported=self.backends,
            quantize=quantize,
            fusion_model_type=pipelined.plan.onnx_model_type,
        )
        self.engine = self.runner.engine
        self._forward_parameters: Any = None
        self.static_batch_size = 0  # rows of the host batch of the current call
        super().__init__(pipelined.model, *args, device=self.engine.device, **kwargs)
        if self.device.type == "meta":  # torchrun: transformers took the first parameter's device, another stage's
            self.device = self.engine.device

    def _buckets(self, buckets: list[int] | None) -> list[int] | None:
        """The sequence buckets: given, else the inference layout's (`inference_parallelize_kwargs`), else the
        runtime's default (None); one static length for inputs that are not token sequences."""
        if not self.bucketed:
            return [self.max_seq_length]
        if buckets is None:
            buckets = self.ipu_config.value("parallelize_kwargs", inference=True).get("sequence_buckets")
        return list(buckets) if buckets is not None else None

    def _resolve_max_seq_length(self, config: Any, max_seq_length: int | None) -> int:
        limit = position_limit(config)
        if max_seq_length is None:
            return min(self.default_max_seq_length, limit) if limit else self.default_max_seq_length
        if not isinstance(max_seq_length, int) or isinstance(max_seq_length, bool) or max_seq_length < 1:
            raise ValueError(f"max_seq_length: got {max_seq_length!r}; expected a positive number of tokens")
        if limit is not None and max_seq_length > limit:
            raise ValueError(
                f"max_seq_length={max_seq_length} is more than the {limit} positions of this {config.model_type} "
                f"model; use at most {limit}"
            )
        return max_seq_length

    # --------------------------------------------------------------------- sizes
    def host_batch_rows(self, batch_size: int | None = None) -> int:
        """Rows of one host batch: per-device `batch_size` x `inference_device_iterations` x the inference replicas
        this process runs (every replica in one process; its share under `torchrun`)."""
        per_device = batch_size if batch_size is not None else (self._batch_size or 1)
        if not isinstance(per_device, int) or isinstance(per_device, bool) or per_device < 1:
            raise ValueError(f"batch_size: got {per_device!r}; expected a positive number of rows per device")
        return per_device * self.runner.layout.rows_per_device()

    # ---------------------------------------------------------------- the call
    def __call__(
        self, inputs: Any, *args: Any, num_workers: int | None = None, batch_size: int | None = None, **kwargs: Any
    ) -> Any:
        """Run the pipeline on one input (returns its result), a list (a list of results) or a dataset / generator
        (an iterator of results), in host batches of `host_batch_rows(batch_size)` rows. `num_workers` is accepted
        for compatibility and unused: inputs are prepared in this process."""
        if args:
            logger.warning("Ignoring args: %s", args)
        if isinstance(inputs, list) and inputs:
            if is_valid_message(inputs[0]):
                inputs = Chat(inputs)
            elif all(isinstance(c, (list, tuple)) and c and is_valid_message(c[0]) for c in inputs):
                inputs = [Chat(chat) for chat in inputs]
        pre, fwd, post = self._sanitize_parameters(**kwargs)
        params = (
            {**self._preprocess_params, **pre},
            {**self._forward_params, **fwd},
            {**self._postprocess_params, **post},
        )
        rows = self.host_batch_rows(batch_size)
        if isinstance(inputs, list):
            return list(self._run(inputs, rows, *params))
        if isinstance(inputs, types.GeneratorType):
            return self._run(inputs, rows, *params)
        if isinstance(inputs, torch.utils.data.Dataset) and hasattr(inputs, "__len__"):
            return self._run((inputs[i] for i in range(len(inputs))), rows, *params)
        if hasattr(inputs, "column_names") and hasattr(inputs, "__iter__"):  # a `datasets.Dataset`
            return self._run(iter(inputs), rows, *params)
        return next(iter(self._run([inputs], rows, *params)))

    def _run(self, inputs: Iterable[Any], rows: int, pre: dict, fwd: dict, post: dict) -> Iterator[Any]:
        """Preprocess lazily, run full host batches as soon as they are ready, and yield results in input order."""
        owners: deque[_Owner] = deque()
        pending: list[tuple[_Owner, dict[str, Any]]] = []
        for item in inputs:
            prepared = self.preprocess(item, **pre)
            model_inputs = list(prepared) if self.chunked else [prepared]
            owner = _Owner(len(model_inputs))
            owners.append(owner)
            pending.extend((owner, m) for m in model_inputs)
            while len(pending) >= rows:
                self._run_batch(pending[:rows], rows, fwd)
                pending = pending[rows:]
            yield from self._finished(owners, post)
        if pending:
            self._run_batch(pending, rows, fwd)
        yield from self._finished(owners, post)

    def _finished(self, owners: deque[_Owner], post: dict) -> Iterator[Any]:
        while owners and owners[0].done:
            owner = owners.popleft()
            yield self.postprocess(owner.outputs if self.chunked else owner.outputs[0], **post)

    def _run_batch(self, batch: list[tuple[_Owner, dict[str, Any]]], rows: int, fwd: dict) -> None:
        real = len(batch)
        items = [m for _, m in batch]
        if self.pads_rows:
            items += [items[-1]] * (rows - real)  # copies of a real row: a row of padding attends to nothing
        self.static_batch_size = rows
        with self.device_placement(), self.get_inference_context()():
            outputs = self._forward(self.collate(items), **fwd)
        # only the tensors travel (the values passed on, such as offsets, are host data already)
        outputs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
        for index, (owner, _) in enumerate(batch):
            owner.outputs.append(_row(outputs, index, len(items)))

    # -------------------------------------------------------------- collation
    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Stack preprocessed model inputs into one batch, padding every token tensor (or numpy array) on the
        tokenizer's padding side to the bucket of the longest (`runner.padded_length`; `max_seq_length` when not
        `bucketed`); values that are neither become lists. Arrays stay arrays for ONNX Runtime, which reads them,
        and become tensors for the engine."""
        if len(items) == 1 and self.bucketed and self.runner.onnx is not None:
            return self._collate_one(items[0])
        keys = list(items[0].keys())
        if any(list(item.keys()) != keys for item in items):
            raise ValueError("the inputs of one batch were prepared with different keys; they cannot be batched")
        side = getattr(self.tokenizer, "padding_side", "right")
        longest = max((v.shape[1] for item in items for v in item.values() if _is_tokens(v)), default=0)
        length = self.runner.padded_length(longest) if self.bucketed else self.max_seq_length
        batch: dict[str, Any] = {}
        for key in keys:
            values = [item[key] for item in items]
            if not isinstance(values[0], (torch.Tensor, np.ndarray)):
                batch[key] = values
            elif values[0].ndim < 2:
                batch[key] = _concatenate([v.reshape(1) if v.ndim == 0 else v for v in values])
            else:
                padded = [self._pad_tokens(key, v, side, length) for v in values]
                batch[key] = padded[0] if len(padded) == 1 else _concatenate(padded)  # batch 1: no copy
            if isinstance(batch[key], np.ndarray) and self.runner.onnx is None:
                batch[key] = torch.from_numpy(batch[key])
        return batch

    def _collate_one(self, item: dict[str, Any]) -> dict[str, Any]:
        """`collate` of a batch of one row on ONNX Runtime: its own length, so nothing to pad or stack (the
        latency path: one request)."""
        batch = {}
        for key, value in item.items():
            if not isinstance(value, (torch.Tensor, np.ndarray)):
                value = [value]
            elif value.ndim == 0:
                value = value.reshape(1)
            elif value.ndim >= 2:
                value = self._pad_tokens(key, value, "right", value.shape[1])  # the checks only: nothing to pad
            batch[key] = value
        return batch

    def _pad_tokens(self, key: str, value: Any, side: str, target: int) -> Any:
        length = value.shape[1]
        if length > self.max_seq_length:
            raise ValueError(
                f"an input has {length} tokens, more than max_seq_length={self.max_seq_length}; shorten it or raise "
                "max_seq_length (pipeline(..., max_seq_length=N))"
            )
        if key == "input_ids":
            fill = self.tokenizer.pad_token_id
            if fill is None:
                raise ValueError(
                    f"{type(self.tokenizer).__name__} has no pad token, which static shapes need; set one, e.g. "
                    "tokenizer.pad_token = tokenizer.eos_token"
                )
        else:
            fill = 1 if key in _PAD_WITH_ONE else 0
        if length == target:
            return value
        shape = (value.shape[0], target - length, *value.shape[2:])
        if isinstance(value, np.ndarray):
            pad = np.full(shape, fill, dtype=value.dtype)
            return np.concatenate([pad, value] if side == "left" else [value, pad], axis=1)
        pad = value.new_full(shape, fill)
        return torch.cat([pad, value] if side == "left" else [value, pad], dim=1)

    # ------------------------------------------------------------------ model
    def run_model(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        """One host call of the backend on a collated batch: the tensors the model's `forward` takes, in the
        inference layout and precision; floating outputs in fp32 for post-processing (numpy arrays from ONNX Runtime
        when the task reads them, `array_outputs`)."""
        if self._forward_parameters is None:  # read once: inspect.signature costs more than a small forward
            parameters = inspect.signature(self.model.forward).parameters
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
            self._forward_parameters = (parameters, takes_any)
        parameters, takes_any = self._forward_parameters
        # e.g. token_type_ids from a BERT tokenizer for DistilBERT, which has no such input
        accepted = {k: v for k, v in model_inputs.items() if takes_any or k in parameters}
        if "use_cache" in parameters:  # as transformers' classification pipelines: no KV cache for one forward
            accepted["use_cache"] = False
        self._check_token_ids(accepted.get("input_ids"))
        outputs = self.runner(accepted, as_numpy=self.array_outputs)
        floating = {k for k, v in outputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
        return {k: v.float() if k in floating else v for k, v in outputs.items()}

    @functools.cached_property
    def _embedding_rows(self) -> int | None:
        """The rows of the model's token embedding (looked up once: every call checks its ids against it); None for
        a model of another input kind."""
        try:
            embeddings = self.model.get_input_embeddings()
        except (AttributeError, NotImplementedError):  # a model of another input kind, or one without the method
            return None
        return embeddings.num_embeddings if isinstance(embeddings, torch.nn.Embedding) else None

    def _check_token_ids(self, input_ids: Any) -> None:
        """Token ids past the model's embeddings: a tokenizer that is not the model's (ONNX Runtime would stop
        inside its embedding kernel, eager PyTorch with an index error naming neither)."""
        rows = self._embedding_rows if torch.is_tensor(input_ids) and input_ids.numel() else None
        if rows is None:
            return
        largest = int(input_ids.max())
        if largest >= rows:
            raise ValueError(
                f"tokenizer: it gave token id {largest}, and the model's embeddings hold {rows} tokens: the tokenizer "
                "does not match the model; pass the model's own tokenizer (tokenizer=...)"
            )

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """Save the stock model (`transformers` layout, whatever the config swapped in), its `ipu_config.json` and
        the tokenizer, so that `pipeline(task, model=save_directory)` builds this pipeline again."""
        self.pipelined.save_pretrained(os.fspath(save_directory), **kwargs)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(save_directory)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(task={self.task!r}, {self.pipelined.describe_layout()}, {self.runner}, "
            f"max_seq_length={self.max_seq_length}, device={self.device})"
        )


def _row(outputs: dict[str, Any], index: int, rows: int) -> dict[str, Any]:
    """Row `index` of a batch's outputs, shaped as a batch of one (what `transformers`' `postprocess` expects)."""
    row = {}
    for key, value in outputs.items():
        if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim and value.shape[0] == rows:
            row[key] = value if rows == 1 else value[index : index + 1]  # a batch of one is that row already
        elif isinstance(value, list) and len(value) == rows:
            row[key] = value[index]
        else:
            row[key] = value
    return row


def _is_tokens(value: Any) -> bool:
    """A token tensor (or numpy array) of a model input (batch x length, as the tokenizer returns it)."""
    return isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim >= 2


def _concatenate(values: list[Any]) -> Any:
    """Tensors or numpy arrays joined along the batch axis."""
    return np.concatenate(values) if isinstance(values[0], np.ndarray) else torch.cat(values)


def _token_inputs(model: nn.Module, tokenizer: Any) -> list[str] | None:
    """The tokenizer's model inputs that the model's forward takes, in the tokenizer's order (what an exported
    graph is fed); `None` without a tokenizer."""
    names = getattr(tokenizer, "model_input_names", None)
    if not names:
        return None
    parameters = inspect.signature(model.forward).parameters
    return [name for name in names if name in parameters]


def pipeline_device(device: int | str | torch.device | None) -> torch.device | None:
    """`pipeline(device=...)` as `transformers` takes it (an index, a name, a `torch.device`), checked against the
    devices of this machine."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("cpu") if device < 0 else torch.device("cuda", device)
    try:
        device = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f'device: got {device!r}; pass "cpu", "cuda", "cuda:N" or a GPU index') from None
    return check_device(device)


def supported_classes(mapping_name: str) -> list[str]:
    """Registered classes (with a stage plan) that `transformers` lists in an auto mapping, e.g.
    `"MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"`: the model classes a task can run."""
    from transformers.models.auto import modeling_auto

    names = set()
    for mapping in mapping_name.split("|"):  # "A|B": the classes of either mapping
        for value in getattr(modeling_auto, mapping).values():
            names.update(value if isinstance(value, tuple) else (value,))
    return [name for name in registered_classes() if name in names]


def check_model_class(model: nn.Module, task: str, mapping_name: str) -> None:
    """A clear error when `model` is not one of the registered classes that serve `task`."""
    name = type(model.model if isinstance(model, PipelinedModel) else model).__name__
    supported = supported_classes(mapping_name)
    if name not in supported:
        raise IncompatibleIPUConfigError(
            f"{task}: the model is a {name}, which is not a registered class for this task; "
            f"use one of: {', '.join(supported)}"
        )
