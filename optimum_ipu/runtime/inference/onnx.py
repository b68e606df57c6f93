"""The `"onnxruntime"` inference backend: a `transformers` model exported to ONNX once and run by ONNX Runtime.

The export has dynamic batch and sequence axes, so every request runs at its own length (no bucket, no padding at
batch 1). ONNX Runtime's transformer optimizer (`onnxruntime.transformers.optimizer`) then fuses the encoder into
its own kernels (EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu) where it knows the family;
the session runs with every graph optimization on and one intra-op thread per core of this process. The model is
exported with `transformers`' eager attention (through its attention registry, put back afterwards), the pattern
the fusion recognises. The fused graph is checked against the model on a sample batch when it is built (an
unfused graph is used if the fused one differs), and kept in `cache_dir` (`graph_cache`: under a key of the
model's code, weights and config, the versions and the export options; written atomically, verified by size and
checksum when read, rebuilt with one warning when damaged), so that a second process starts without exporting.

`quantize=True` stores the weights of the matrix multiplications (and of the fused attention's projections) in int8,
one scale per output channel (`onnxruntime.quantization.quantize_dynamic(per_channel=True)`: activations quantized per
call): faster on CPUs, not exact. One scale per tensor, as before, cost 2.8 F1 on the fine-tuned MiniLM of `make demo`;
per channel, 0.4 (BENCHMARKS.md, "Latency").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..graph_cache import cached_file, discard_entry, model_key

logger = logging.getLogger(__name__)

# ONNX opset of the export (TorchScript exporter: the graph pattern ONNX Runtime's BERT fusions match).
OPSET = 17
# How far the fused graph's outputs may be from the model's on the check batch before the unfused one is used.
FUSION_TOLERANCE = 1e-3
# the int8 scheme of `quantize=True`, part of the graph cache key: a graph quantized otherwise is not served
INT8_SCHEME = "dynamic-int8-per-channel"


def _threads() -> int:
    """CPU cores this process may use (its affinity mask), the intra-op threads of the session."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cache_header(options: dict[str, Any]) -> dict[str, Any]:
    """What besides the model decides the exported file: the versions of the libraries that build it and the
    export options."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("torch", "onnxruntime", "onnx", "transformers", "optimum-ipu"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:  # a source checkout not installed: the code digest covers our code
            versions[package] = None
    with open(__file__, "rb") as f:  # this exporter's own code (an edit of it between releases too)
        exporter = hashlib.sha256(f.read()).hexdigest()
    return {**versions, "exporter": exporter, "opset": OPSET, "tolerance": FUSION_TOLERANCE, **options}


class _KeywordCall(nn.Module):
    """`model` called with its inputs by keyword, from positional arguments in `names`' order (for the exporter)."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.names = model, list(names)

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.model(**dict(zip(self.names, tensors, strict=True)))


@contextlib.contextmanager
def _eager_attention(model: nn.Module) -> Iterator[None]:
    """`transformers`' eager attention for the export (the pattern ONNX Runtime fuses), the model's own after."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before in (None, "eager") or not hasattr(model, "set_attn_implementation"):
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def sample_inputs(model: nn.Module, input_names: Sequence[str], batch: int = 2, length: int = 16) -> dict:
    """A small batch of token inputs for the export and its check: random ids, a mask with one padded token."""
    generator = torch.Generator().manual_seed(0)
    vocab = getattr(model.config, "vocab_size", 100)
    inputs = {}
    for name in input_names:
        if name == "input_ids":
            inputs[name] = torch.randint(3, vocab, (batch, length), generator=generator)
        elif name == "attention_mask":
            inputs[name] = torch.ones(batch, length, dtype=torch.long)
            inputs[name][-1, -1] = 0
        else:  # token_type_ids and the like
            inputs[name] = torch.zeros(batch, length, dtype=torch.long)
    return inputs


class OnnxRuntimeModel:
    """A `transformers` model's forward, exported to ONNX and run by ONNX Runtime at any batch and length.

    Args:
        model (`nn.Module`): the model (its eval-mode forward is exported; it is not changed).
        input_names (`Sequence[str]`): the token inputs the forward takes, in the order they are given, e.g.
            `("input_ids", "attention_mask", "token_type_ids")`.
        cache_dir (`str`, *optional*): where the exported (and fused) graph is kept between processes (the config's
            `executable_cache_dir`); a temporary folder when not given.
        threads (`int`, *optional*): intra-op threads (default: the cores this process may use).
        optimize (`bool`, *optional*, defaults to `True`): fuse the graph with ONNX Runtime's transformer optimizer.
        quantize (`bool`, *optional*, defaults to `False`): int8 weights, one scale per output channel (dynamic
            quantization); not exact.
        device (`torch.device`, *optional*): `cuda` runs on ONNX Runtime's CUDA provider (which must be installed).
        fusion_model_type (`str`, *optional*): the model type whose fusions ONNX Runtime's transformer optimizer
            applies (the model's stage plan says it: `StagePlan.onnx_model_type`, `"bert"` for RoBERTa); the
            config's `model_type` when not given. A type the optimizer does not name is not fused.
    """

    def __init__(
        self,
        model: nn.Module,
        input_names: Sequence[str],
        *,
        cache_dir: str | None = None,
        threads: int | None = None,
        optimize: bool = True,
        quantize: bool = False,
        device: torch.device | None = None,
        fusion_model_type: str | None = None,
    ) -> None:
        import onnxruntime

        # in the forward's order: the order of the exported graph's inputs
        order = list(inspect.signature(model.forward).parameters)
        unknown = [name for name in input_names if name not in order]
        if unknown:
            raise ValueError(f"input_names: {unknown} are not inputs of {type(model).__name__}.forward")
        self.input_names = sorted(input_names, key=order.index)
        self.quantize, self.threads = quantize, threads or _threads()
        self.fusion_model_type = fusion_model_type or model.config.model_type
        self.providers = ["CPUExecutionProvider"]
        if device is not None and device.type == "cuda":
            if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                raise ValueError(
                    "backend='onnxruntime' on a GPU needs onnxruntime-gpu (CUDAExecutionProvider); choose "
                    "backend='compile' on GPUs or install onnxruntime-gpu"
                )
            self.providers.insert(0, "CUDAExecutionProvider")
        model = model.eval()
        sample = sample_inputs(model, self.input_names)
        with torch.no_grad():
            reference = model(**sample)
        self.output_names = [k for k, v in reference.items() if isinstance(v, torch.Tensor)]
        options = {"inputs": self.input_names, "optimize": optimize, "quantize": quantize and INT8_SCHEME}
        key = model_key(model, _cache_header({**options, "fusion": self.fusion_model_type}))
        self._tmp = None if cache_dir else tempfile.TemporaryDirectory(prefix="optimum-ipu-onnx-")
        root = os.path.join(cache_dir, "onnx") if cache_dir else self._tmp.name

        def build(folder: str) -> str:
            return self._build(model, sample, reference, folder, optimize)

        self.path = cached_file(root, key, "model.onnx", build, what="ONNX graph")
        try:
            self.session = self._session(self.path)
        except Exception as err:  # onnxruntime's load errors have no common type
            discard_entry(self.path, f"{type(err).__name__}: {str(err).strip()[:200]}", what="ONNX graph")
            self.path = cached_file(root, key, "model.onnx", build, what="ONNX graph")
            self.session = self._session(self.path)

    # ------------------------------------------------------------------ building
    def _build(self, model: nn.Module, sample: dict, reference: Any, folder: str, optimize: bool) -> str:
        """Export (fuse, quantize) the model into `folder`, a folder of this writer's own; the chosen file's path."""
        exported = os.path.join(folder, "exported.onnx")
        axes = {name: {0: "batch", 1: "sequence"} for name in self.input_names}
        axes.update({name: {0: "batch", 1: "sequence"} for name in self.output_names})
        export = functools.partial(
            torch.onnx.export,
            f=exported,
            input_names=self.input_names,
            output_names=self.output_names,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
        with _eager_attention(model), torch.no_grad():
            try:
                export(model, (), kwargs=dict(sample))
            except TypeError:
                # The TorchScript exporter binds keywords to the forward's positions; through `transformers`' wrapped
                # forward of a base model (`BertModel`) that gave `use_cache` twice ("got multiple values for
                # argument 'use_cache'"). Called by keywords from a wrapper instead (its parameters then carry the
                # prefix `model.`, which only the names of the graph's initializers show).
                export(_KeywordCall(model, self.input_names), tuple(sample[name] for name in self.input_names))
        if not self._matches(exported, sample, reference):
            raise RuntimeError(f"the ONNX export of {type(model).__name__} does not give the model's outputs")
        chosen = exported
        if optimize:
            fused = self._fuse(model.config, self.fusion_model_type, exported, os.path.join(folder, "fused.onnx"))
            if fused is not None and self._matches(fused, sample, reference):
                chosen = fused
            elif fused is not None:
                logger.warning("ONNX Runtime's fused graph differs from the model; running the unfused graph")
        if self.quantize:
            import onnx
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantized = os.path.join(folder, "quantized.onnx")
            # the fused graph's contrib ops defeat ONNX shape inference: their outputs are fp32
            extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
            # per output channel: one scale per tensor lets a few large weights of a channel crush the others
            quantize_dynamic(chosen, quantized, weight_type=QuantType.QInt8, per_channel=True, extra_options=extra)
            chosen = quantized
        return chosen

    @staticmethod
    def _fuse(config: Any, model_type: str, path: str, out: str) -> str | None:
        """ONNX Runtime's transformer fusions of `model_type` (one of the optimizer's `MODEL_TYPES`, e.g. the BERT
        encoder's); `None` for a type it does not name."""
        from onnxruntime.transformers.optimizer import MODEL_TYPES, optimize_model

        if model_type not in MODEL_TYPES:
            return None
        heads = getattr(config, "num_attention_heads", 0) or getattr(config, "n_heads", 0)
        hidden = getattr(config, "hidden_size", 0) or getattr(config, "dim", 0)
        optimized = optimize_model(path, model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=1)
        optimized.save_model_to_file(out)
        return out

    def _matches(self, path: str, sample: dict, reference: Any) -> bool:
        outputs = self._session(path).run(self.output_names, self._feed(sample))
        return all(
            np.allclose(out, reference[name].float().numpy(), atol=FUSION_TOLERANCE, rtol=FUSION_TOLERANCE)
            for name, out in zip(self.output_names, outputs, strict=True)
        )

    def _session(self, path: str) -> Any:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = self.threads
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        return onnxruntime.InferenceSession(path, options, providers=self.providers)

    # ------------------------------------------------------------------ running
    def _feed(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise ValueError(f"the exported model takes {self.input_names}; {missing} not given")
        return {
            name: np.ascontiguousarray(
                inputs[name].numpy() if isinstance(inputs[name], torch.Tensor) else inputs[name], dtype=np.int64
            )
            for name in self.input_names
        }

    def run_numpy(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """The outputs as numpy arrays (fp32) for inputs given as tensors or arrays (batch x length each)."""
        return dict(zip(self.output_names, self.session.run(self.output_names, self._feed(inputs)), strict=True))

    def __call__(self, **inputs: Any) -> dict[str, torch.Tensor]:
        """The model's outputs (those that are tensors, e.g. `start_logits` and `end_logits`) as CPU tensors."""
        return {name: torch.from_numpy(value) for name, value in self.run_numpy(inputs).items()}

    def __repr__(self) -> str:
        kind = "int8 " if self.quantize else ""
        return f"OnnxRuntimeModel({kind}{os.path.basename(os.path.dirname(self.path))}, threads={self.threads})"


__all__ = ["OnnxRuntimeModel", "sample_inputs", "OPSET"]
