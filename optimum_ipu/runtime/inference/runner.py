"""Low-latency inference: sequence-length buckets, the backends that run a model's forward, and how one is chosen.

A request is padded to the smallest bucket that holds it (a small fixed set of lengths up to the static length),
not to the static length itself, so that a short question costs a short forward while the compiled graphs stay
few (one per bucket). The backends:

- `"eager"`: the model through the engine (autocast in the chosen precision), at the bucket's length;
- `"compile"`: the same, through `torch.compile(dynamic=False)`: one graph per bucket, kept in the config's
  `executable_cache_dir`; on CUDA with `mode="reduce-overhead"` (CUDA graphs: one kernel launch per forward);
- `"onnxruntime"`: the model exported to ONNX once (dynamic batch and sequence axes), fused by ONNX Runtime's
  transformer optimizer (attention, LayerNorm, GELU) and run at each request's own length
  (`OnnxRuntimeModel`, `optimum_ipu.runtime.inference.onnx`), optionally with int8 weights (dynamic quantization).

`"auto"` picks, per device, the backend measured fastest for encoder models at batch 1 (BENCHMARKS.md, "Latency"):
ONNX Runtime on CPUs (the fused graph at the request's own length: 1.6-2x eager PyTorch, where `torch.compile`
gains under 10%), `torch.compile` with CUDA graphs in fp16 on GPUs (launch overhead dominates a batch-1 forward
there). Without ONNX Runtime installed (the `[onnx]` extra) the CPU takes `"eager"`.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ...config import IPUConfig
from ...config_validation import MAX_BUCKETS, check_sequence_buckets, sorted_lengths
from ..devices import cpu_supports_bf16, default_device
from ..engine import Engine
from ..layouts.inference import inference_layout
from ..process_flags import checked_cache_dir
from ..quantization import require_torchao

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "eager", "compile", "onnxruntime")


def default_buckets(max_seq_length: int, count: int = 6) -> list[int]:
    """The default sequence-length buckets for a static length: about `count` lengths that are multiples of a power
    of two (at least 16), the last one `max_seq_length` itself. For 384: `[64, 128, 192, 256, 320, 384]`; for 128:
    `[32, 64, 96, 128]`; for 512: `[128, 256, 384, 512]`.

    Args:
        max_seq_length (`int`): the static length (the longest bucket).
        count (`int`, *optional*, defaults to 6): about how many buckets (at most `MAX_BUCKETS`).
    """
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length: got {max_seq_length!r}; expected a positive number of tokens")
    step = max(16, 2 ** math.ceil(math.log2(max(1, max_seq_length / min(count, MAX_BUCKETS)))))
    buckets = list(range(step, max_seq_length, step))
    return [*buckets, max_seq_length]


def check_buckets(buckets: Sequence[int], max_seq_length: int) -> list[int]:
    """`buckets` sorted, checked against `max_seq_length` (the longest must be it, so that every input fits)."""
    ordered = sorted_lengths(buckets, "buckets")
    if ordered[-1] != max_seq_length:
        raise ValueError(
            f"buckets: the longest is {ordered[-1]} but max_seq_length is {max_seq_length}; end the list with "
            f"{max_seq_length} (every input must fit the longest bucket)"
        )
    if len(ordered) > MAX_BUCKETS:
        raise ValueError(
            f"buckets: {len(ordered)} given; at most {MAX_BUCKETS} (one compiled graph each), e.g. "
            f"{default_buckets(max_seq_length)}"
        )
    return ordered


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket of `buckets` (sorted) that holds `length` tokens (the longest if none does: the caller
    reports the input as too long)."""
    for bucket in buckets:
        if length <= bucket:
            return bucket
    return buckets[-1]


# Inputs with one value per token of the sequence: cut with the padding columns.
TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "special_tokens_mask", "inputs_embeds")
# Labels that index sequence positions (question answering's span ends): their loss is a softmax over every column,
# padding included, so cutting columns would change the evaluation loss.
POSITION_LABELS = ("start_positions", "end_positions")


def buckets_within(width: int, buckets: Sequence[int] | None = None) -> list[int]:
    """The buckets a batch of `width` columns may be cut to: those of `buckets` (as `check_sequence_buckets`
    returns them, checked once by the caller: this runs for every batch) shorter than `width`, then `width` itself
    (so a batch never grows); `default_buckets(width)` without `buckets`."""
    if not buckets:
        return default_buckets(width)
    return [*(b for b in buckets if b < width), width]


def trim_to_bucket(inputs: Mapping[str, Any], buckets: Sequence[int] | None = None) -> Mapping[str, Any]:
    """A collated batch of token inputs cut to the smallest bucket that holds its longest row: the trailing columns
    that are padding in every row (`attention_mask` 0) go, down to that bucket (`buckets_within`). What the model
    computes at the real tokens does not change (padded keys are masked out of attention), and evaluation costs
    what the batch's real length does, in few shapes (one compiled graph per bucket).

    Safety first: the batch is returned unchanged (the same object) unless it has a 2-D `attention_mask` and every
    row has a token; only trailing columns are cut (right padding: left padding keeps the batch whole, since cutting
    leading columns would shift positions). `TOKEN_KEYS` of the mask's width are cut; any other tensor of that width
    (`labels` of token classification or language modelling) is cut only when its cut columns are all -100 (ignored
    by the loss), else the batch is unchanged. Tensors of another width (a decoder's labels), 1-D tensors (class
    labels) and inputs that are not tokens (`pixel_values`, `input_features`) are kept as they are. A batch with
    `POSITION_LABELS` (question answering's `start_positions`) is unchanged: its loss is a softmax over every
    column.

    Args:
        inputs (`Mapping[str, Any]`): the batch, as the collator made it.
        buckets (`Sequence[int]`, *optional*): the sequence lengths to cut to (e.g. `inference_parallelize_kwargs
            ["sequence_buckets"]`, checked by `check_sequence_buckets`); `default_buckets(width)` when not given.

    Returns:
        `Mapping[str, Any]`: a new dict with the cut tensors (and the other values as they were), or `inputs`.

    Example:

    ```python
    >>> batch = {"input_ids": ids, "attention_mask": mask}  # width 384, longest row 150 tokens
    >>> trim_to_bucket(batch)["input_ids"].shape[1]  # the smallest of default_buckets(384) that holds 150
    192
    ```
    """
    mask = inputs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or any(key in inputs for key in POSITION_LABELS):
        return inputs
    width = mask.shape[1]
    real = mask != 0
    if width == 0 or not bool(real.any(dim=1).all()):  # a row of padding alone: its output depends on the width
        return inputs
    longest = int(real.any(dim=0).nonzero()[-1]) + 1
    keep = bucket_for(longest, buckets_within(width, buckets))
    if keep >= width:
        return inputs
    trimmed = dict(inputs)
    for key, value in inputs.items():
        if not isinstance(value, torch.Tensor) or value.dim() < 2:
            continue
        if key in TOKEN_KEYS:
            if value.shape[1] != width:  # not aligned with the mask: nothing is known to be padding
                return inputs
            trimmed[key] = value[:, :keep].contiguous()  # models call .view()
        elif value.shape[1] == width:
            if not bool((value[:, keep:] == -100).all()):
                return inputs
            trimmed[key] = value[:, :keep].contiguous()
    return trimmed


def onnxruntime_available() -> bool:
    """Whether ONNX Runtime and the ONNX exporter's packages are installed (the `[onnx]` extra)."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def resolve_backend(backend: str, device: torch.device, supported: Sequence[str] = BACKENDS) -> str:
    """The backend `"auto"` stands for on `device` (see the module docstring), or `backend` checked.

    Args:
        backend (`str`): one of `BACKENDS`.
        device (`torch.device`): where the model runs.
        supported (`Sequence[str]`, *optional*): the backends the caller can run (a task whose inputs are not
            tokens runs `"eager"` and `"compile"` only).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: got {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if device.type == "cpu":
            backend = "onnxruntime" if "onnxruntime" in supported and onnxruntime_available() else "eager"
        else:
            backend = "compile" if "compile" in supported else "eager"
        return backend
    if backend not in supported:
        raise ValueError(f"backend={backend!r}: this task runs {', '.join(supported)}; choose one of them")
    if backend == "onnxruntime" and not onnxruntime_available():
        raise ValueError(
            "backend='onnxruntime': ONNX Runtime is not installed; pip install 'optimum-ipu[onnx]' or choose "
            "backend='eager' / 'compile'"
        )
    if backend == "compile" and device.type == "cpu" and not cpp_compiler_available():
        raise ValueError(
            "backend='compile' on a CPU: torch.compile builds its kernels with a C++ compiler, and none is on PATH "
            "(g++, c++, clang++ or $CXX); install one (apt install g++) or choose backend='eager'"
        )
    return backend


def cpp_compiler_available() -> bool:
    """Whether a C++ compiler that `torch.compile`'s inductor can build CPU kernels with is on `PATH` (`$CXX`, else
    one of the names it tries): without one, its first call fails deep inside the compilation."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return any(shutil.which(name) for name in names)


def default_precision(device: torch.device) -> str:
    """Inference precision when none is given: fp16 on accelerators (as Optimum Graphcore's `pipeline(fp16=True)`),
    fp32 on CPUs (half precision is slower there and not exact)."""
    return "fp32" if device.type == "cpu" else "fp16"


def encoder_precision(device: torch.device, precision: str | None = None) -> str:
    """The precision a speech model's encoder runs in, apart from its decoder (`optimum_ipu.pipelines.speech`):
    `precision` when given; else bf16 on a CPU that multiplies bf16 natively (`cpu_supports_bf16`: AVX512-BF16,
    AMX), where Whisper tiny.en's encoder takes about half its fp32 time and its tokens stay those of fp32 on
    `jfk.flac` and the FSDD clips (`tests/test_pipelines_speech_speed.py`); else `default_precision(device)`."""
    if precision is not None:
        return precision
    if device.type == "cpu" and cpu_supports_bf16():
        return "bf16"
    return default_precision(device)


def compile_options(device: torch.device) -> dict[str, Any]:
    """`torch.compile` options of the `"compile"` backend: one static graph per bucket (`dynamic=False`); on CUDA,
    `mode="reduce-overhead"` (CUDA graphs: the whole forward replayed by one launch)."""
    options: dict[str, Any] = {"dynamic": False}
    if device.type == "cuda":
        options["mode"] = "reduce-overhead"
    return options


class InferenceRunner:
    """Runs the inference host calls of a pipelined model with one backend (see the module docstring).

    Args:
        model (`nn.Module`): a parallelized `PipelinedModel` in eval mode.
        ipu_config (`IPUConfig`): its config (read with `value(..., inference=True)`; its mode is not changed).
        backend (`str`, *optional*, defaults to `"auto"`): `"auto"`, `"eager"`, `"compile"` or `"onnxruntime"`.
        precision (`str`, *optional*): `"fp32"`, `"fp16"` or `"bf16"`; `default_precision(device)` when not given.
            ONNX Runtime runs the exported fp32 graph.
        device (`torch.device`, *optional*): defaults to this process's GPU, else the CPU.
        buckets (`Sequence[int]`, *optional*): sequence lengths inputs are padded to (the smallest that holds the
            batch's longest input); `default_buckets(max_seq_length)` when not given. ONNX Runtime needs none: it
            runs every batch at its longest input's length.
        max_seq_length (`int`): the static length, the longest bucket.
        input_names (`Sequence[str]`, *optional*): the token inputs of the forward, in order (the ONNX export's
            inputs); required for `"onnxruntime"`.
        supported (`Sequence[str]`, *optional*): the backends the caller can feed (see `resolve_backend`).
        quantize (`bool`, *optional*, defaults to `False`): int8 weights (not exact): ONNX Runtime's dynamic
            quantization; on the other backends, the model's `parallelize(use_group_quantized_linears=True)` (a
            `PipelinedModel`'s linear weights in int8 per group, by torchao; in place).
        threads (`int`, *optional*): ONNX Runtime's intra-op threads (default: this process's cores).
        fusion_model_type (`str`, *optional*): the model type whose fusions ONNX Runtime applies (the model's
            `StagePlan.onnx_model_type`); the config's `model_type` when not given.
    """

    def __init__(
        self,
        model: nn.Module,
        ipu_config: IPUConfig,
        *,
        backend: str = "auto",
        precision: str | None = None,
        device: torch.device | None = None,
        buckets: Sequence[int] | None = None,
        max_seq_length: int,
        input_names: Sequence[str] | None = None,
        supported: Sequence[str] = BACKENDS,
        quantize: bool = False,
        threads: int | None = None,
        fusion_model_type: str | None = None,
    ) -> None:
        device = device or default_device()
        requested = backend
        if not input_names:  # ONNX Runtime is fed token inputs only
            supported = [name for name in supported if name != "onnxruntime"]
        self.backend = resolve_backend(backend, device, supported)
        self.precision = precision or default_precision(device)
        self.buckets = (
            check_buckets(buckets, max_seq_length) if buckets is not None else default_buckets(max_seq_length)
        )
        if self.backend == "onnxruntime" and self.precision != "fp32":
            if requested == "onnxruntime":
                raise ValueError(
                    f"backend='onnxruntime' runs the fp32 graph; precision={self.precision!r} is not served"
                )
            self.backend = "eager"  # auto: the half precision asked for
        self.layout = inference_layout(model, ipu_config)  # the whole model here, or one stage of it (torchrun)
        self.backend = self.layout.backend(self.backend)
        compile_ = compile_options(device) if self.backend == "compile" else False
        self.engine = Engine(model, ipu_config, precision=self.precision, device=device, compile=compile_)
        self.layout.attach(self.engine, model, self.precision)
        self.onnx = None
        if self.backend == "onnxruntime":
            self.onnx = self._export(model, ipu_config, input_names, requested, quantize, threads, fusion_model_type)
        if quantize and self.onnx is None:  # eager / compile: the model's own weight-only int8 (torchao)
            require_torchao(f"quantize=True on backend={self.backend!r}")
            model.parallelize(use_group_quantized_linears=True)

    def _export(
        self,
        model: nn.Module,
        ipu_config: IPUConfig,
        input_names: Sequence[str],
        requested: str,
        quantize: bool,
        threads: int | None,
        fusion_model_type: str | None,
    ) -> Any:
        from .onnx import OnnxRuntimeModel

        stock = getattr(model, "model", model)  # the transformers model inside the PipelinedModel
        # a bad folder is the config's fault, said in one line (with backend="auto" too: not a fall back to eager)
        cache_dir = checked_cache_dir(ipu_config.executable_cache_dir) if ipu_config.executable_cache_dir else None
        try:
            return OnnxRuntimeModel(
                stock,
                input_names,
                cache_dir=cache_dir,
                threads=threads,
                quantize=quantize,
                device=self.engine.device,
                fusion_model_type=fusion_model_type,
            )
        except Exception as err:  # the exporter's failures have no common type
            if requested == "onnxruntime":
                raise
            logger.warning(
                "backend='auto': %s could not be exported to ONNX (%s: %.200s); running it eagerly",
                type(stock).__name__,
                type(err).__name__,
                err,
            )
            self.backend = "eager"
            return None

    def padded_length(self, length: int) -> int:
        """The length a batch whose longest input has `length` tokens is padded to: its bucket, or `length` itself
        on ONNX Runtime (dynamic shapes)."""
        return length if self.onnx is not None else bucket_for(length, self.buckets)

    def __call__(self, batch: dict[str, Any], as_numpy: bool = False) -> dict[str, Any]:
        """One inference host call on a collated batch (token tensors padded to `padded_length`). With `as_numpy`,
        ONNX Runtime's outputs stay numpy arrays (no round trip through tensors for a caller that reads arrays);
        the engine's are tensors either way."""
        if self.onnx is not None:
            inputs = {name: batch[name] for name in self.onnx.input_names}
            return self.onnx.run_numpy(inputs) if as_numpy else self.onnx(**inputs)
        return self.engine.eval_step(batch)

    def __repr__(self) -> str:
        shapes = "dynamic shapes" if self.onnx is not None else f"buckets={self.buckets}"
        return f"InferenceRunner(backend={self.backend!r}, precision={self.precision!r}, {shapes})"


__all__ = [
    "InferenceRunner",
    "BACKENDS",
    "MAX_BUCKETS",
    "default_buckets",
    "check_buckets",
    "bucket_for",
    "check_sequence_buckets",
    "buckets_within",
    "trim_to_bucket",
    "TOKEN_KEYS",
    "POSITION_LABELS",
    "onnxruntime_available",
    "resolve_backend",
    "default_precision",
    "encoder_precision",
    "compile_options",
]
