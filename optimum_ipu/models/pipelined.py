"""`to_pipelined`: an unmodified `transformers` model with the stage layout of an `IPUConfig` applied.

The stock model is kept as it is (`pipelined.model`); the wrapper records which module runs on which
device slot and turns on the execution features of the config through the model's own APIs
(`gradient_checkpointing_enable`) or by swapping single submodule instances (serialization), all undone
by `deparallelize()`. In one process the stages run in turn on one device, so the numbers are exactly
those of the stock model; the distributed runtime builds one stage per process from the same layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from transformers.utils.logging import get_logger

from ..config import IPUConfig, report_parallelize_kwargs
from ..errors import IncompatibleIPUConfigError
from ..runtime.distributed import world_size
from ..runtime.quantization import quantize_linear_weights, require_torchao
from ..runtime.serialization import chunked_cross_entropy, swap_serialized
from ..runtime.stages.balance import auto_layers_per_ipu
from ..runtime.stages.cut import EncoderSplit, StageCut
from .generation import StaticGeneration
from .layout import (
    StageSpec,
    check_auto_on_stage_processes,
    format_layout,
    layers_per_stage,
    measured_auto_fields,
    stage_layout,
)
from .plans import plan_for_model, unwrap_adapters
from .stage_plan import StagePlan

logger = get_logger(__name__)


def _report_ipu_only_knobs(ipu_config: IPUConfig) -> None:
    fields = sorted(ipu_config.ipu_only_fields_set())
    if fields:
        logger.warning_once(
            f"{', '.join(fields)}: IPU compiler memory knobs, kept in the config but without effect on GPUs and CPUs."
        )


def _serializing_fields(ipu_config: IPUConfig, kind: str) -> list[tuple[str, Any]]:
    """The fields (and their values) that serialize the `kind` (`"embedding"` or `"projection"`) module: the per-IPU
    splits where given, else the factor, of training and of inference."""
    fields = []
    for prefix in ("", "inference_"):
        splits, factor = f"{prefix}serialized_{kind}_splits_per_ipu", f"{prefix}{kind}_serialization_factor"
        given = ipu_config.__dict__
        if (given.get(factor) or 1) > 1:  # the factor is the splits' sum where they are given
            fields.append((splits, given[splits]) if given.get(splits) is not None else (factor, given[factor]))
    return fields


class PipelinedModel(StaticGeneration, nn.Module):
    """A `transformers` model laid out in pipeline stages as an `IPUConfig` says.

    Calling it runs the stock model's `forward` (same arguments, same outputs). Use `to_pipelined()` to
    build one, `parallelize()` to apply the layout and execution features, `deparallelize()` to get the
    stock model back exactly (same modules, same `state_dict`). `generate()` runs at static shapes
    (`optimum_ipu.models.generation.StaticGeneration`).

    Args:
        model (`transformers.PreTrainedModel`): a model of a registered class (see `registered_classes()`), or
            one whose base model holds one list of identical layers (or an encoder and a decoder list): its
            plan is then derived (`optimum_ipu.models.derived`).
        ipu_config (`IPUConfig`): the layout and execution configuration.
    """

    def __init__(self, model: nn.Module, ipu_config: IPUConfig) -> None:
        super().__init__()
        self.plan: StagePlan = plan_for_model(model)
        # the stock class name as built: FSDP2's fully_shard later swaps the class for an `FSDP...` subclass, and an
        # adapter wrapper (peft's `PeftModelForCausalLM`) is not the class the plan knows
        self.class_name = type(unwrap_adapters(model)[1]).__name__
        self.model = model
        self.ipu_config = ipu_config
        self._undo: list[Callable[[], None]] = []
        self._parallelized = False
        # `parallelize(**knobs)`'s generation defaults (over the config's `inference_parallelize_kwargs`)
        self.generation_defaults: dict[str, Any] = {}

    # ------------------------------------------------------------------ structure
    @property
    def config(self) -> Any:
        """The wrapped model's `transformers` config."""
        return self.model.config

    @property
    def base_prefix(self) -> str:
        """Dotted path of `model.base_model` inside the model (`"bert"`, or `""` when it is the model); through an
        adapter wrapper (`peft`), from the wrapper (`"base_model.model.bert"`)."""
        outer, stock = unwrap_adapters(self.model)
        prefix = getattr(stock, "base_model_prefix", "")
        prefix = prefix if prefix and hasattr(stock, prefix) else ""
        return ".".join(part for part in (outer, prefix) if part)

    def _path(self, relative: str) -> str:
        return f"{self.base_prefix}.{relative}" if self.base_prefix else relative

    def _find(self, relative: str) -> str:
        """Full dotted path of a plan entry; `"a|b"` names alternatives across transformers versions."""
        for candidate in relative.rstrip("?").split("|"):
            try:
                self.model.get_submodule(self._path(candidate))
                return self._path(candidate)
            except AttributeError:
                continue
        # Not AttributeError: nn.Module.__getattr__ would hide it behind a confusing message.
        raise IncompatibleIPUConfigError(
            f"{type(self.model).__name__} has no submodule {relative!r} that its stage plan names; "
            "this transformers version may have renamed it"
        )

    def _layer_lists(self) -> list[str]:
        """Full paths of the plan's layer lists that this model has (a list marked `"?"` may be absent)."""
        found = []
        for list_path in self.plan.layers:
            try:
                found.append(self._find(list_path))
            except IncompatibleIPUConfigError:
                if not list_path.endswith("?"):
                    raise
        return found

    def layer_paths(self) -> list[str]:
        """Dotted paths of every pipeline layer, in the order `layers_per_ipu` counts them."""
        return [f"{full}.{i}" for full in self._layer_lists() for i in range(len(self.model.get_submodule(full)))]

    def stage_cut(self) -> StageCut:
        """What the stage runtime needs to run the stages apart: the layers, the encoder-decoder split and the
        plan's stand-ins (see `optimum_ipu.runtime.stages.cut`)."""
        lists = self._layer_lists()
        encoder = None
        if self.plan.encoder is not None and len(lists) == 2:  # T5EncoderModel: an encoder alone is one stack
            encoder = EncoderSplit(self._find(self.plan.encoder), len(self.model.get_submodule(lists[0])))
        embeddings = []
        for path in self.plan.embeddings:  # a family's optional parts (rotary tables) may be absent in a version
            try:
                embeddings.append(self._find(path))
            except IncompatibleIPUConfigError:
                continue
        return StageCut(
            self.layer_paths(),
            encoder,
            self.plan.layer_stand_in,
            strict=self.plan.derived,
            embeddings=embeddings,
            # a derived plan's embeddings are guessed by name: every stage runs them whole, as before
            shape_only_embeddings=self.plan.embeddings_feed_hidden_states_only and not self.plan.derived,
        )

    @property
    def num_layers(self) -> int:
        return len(self.layer_paths())

    def stage_layout(self, inference: bool | None = None) -> list[StageSpec]:
        """The stages of the inference (`inference=True`) or training layout; by default, of the layout this
        model's mode selects (`eval()`: inference, `train()`: training). The shared config's mode is not read."""
        inference = not self.training if inference is None else inference
        return stage_layout(self.ipu_config, self.num_layers, inference=inference)

    def stage_modules(self) -> list[list[str]]:
        """Dotted module paths owned by each stage: embeddings with stage 0, layers as laid out, and every
        other top-level part (heads, pooler, final norms) with the last stage."""
        stages = self.stage_layout()
        layers = self.layer_paths()
        owned = [[] for _ in stages]
        owned[0].extend(self._find(p) for p in self.plan.embeddings)
        for stage in stages:
            owned[stage.index].extend(layers[i] for i in stage.layers)
        covered = set().union(*map(set, owned)) | set(self._layer_lists())
        for name, _ in self.model.named_modules():
            if not name or any(name == c or name.startswith(c + ".") or c.startswith(name + ".") for c in covered):
                continue
            if not any(name.startswith(o + ".") for o in owned[-1]):
                owned[-1].append(name)
        return owned

    def describe_layout(self) -> str:
        """A printable table of what each device slot holds."""
        return f"{self.class_name} ({self.num_layers} layers):\n{format_layout(self.stage_layout())}"

    # ------------------------------------------------------------- (de)parallelize
    def parallelize(self, for_generation: bool = False, **kwargs: Any) -> PipelinedModel:
        """Check the layout against the model and turn on the config's execution features.

        Args:
            for_generation (`bool`, *optional*, defaults to `False`): Optimum Graphcore's switch to a model that
                generates; accepted, since `generate()` needs nothing more here.
            kwargs: Optimum Graphcore's `parallelize()` knobs, as its Whisper notebook passes them (`use_cache`,
                `batch_size`, `max_length`, `num_beams`, `on_device_generation_steps`, ...): those of
                `IPUConfig`'s `inference_parallelize_kwargs` that mean something here become defaults of
                `generate()` (over the config's own); `use_group_quantized_linears=True` stores the linear weights of
                the layers in int8 (`quantize_linears()`); the rest is named once (see `report_parallelize_kwargs`).

        Example (Optimum Graphcore's Whisper notebook):

        ```python
        >>> pipelined = to_pipelined(model, IPUConfig(ipus_per_replica=2)).parallelize(
        ...     for_generation=True, use_cache=True, batch_size=1, max_length=448, on_device_generation_steps=16)
        >>> pipelined.generate(input_features, min_length=3)
        ```
        """
        quantize = kwargs.pop("use_group_quantized_linears", False)
        if quantize:
            self._check_quantizable()  # before anything changes
        if kwargs:
            realised = report_parallelize_kwargs(kwargs, "parallelize(): the knob")
            self.generation_defaults = {**self.generation_defaults, **realised}
        if not self._parallelized:
            self._apply_layout()
        if quantize:
            self.quantize_linears()
        return self

    def _apply_layout(self) -> None:
        """Check the layout against the model (a clear error now, not mid-run) and turn on the config's execution
        features, each undone by `deparallelize()`."""
        if self.ipu_config.__dict__.get("auto_layers"):
            self._balance_auto_layers()
        for inference in (False, True):  # both layouts must fit the model: a clear error now, not mid-run
            self.stage_layout(inference=inference)
        _report_ipu_only_knobs(self.ipu_config)
        cfg = self.ipu_config
        # swapped once for both modes: the larger factor of the two (the numbers are the same; only memory differs)
        emb = max(cfg.value("embedding_serialization_factor", inference=i) for i in (False, True))
        proj = max(cfg.value("projection_serialization_factor", inference=i) for i in (False, True))
        split = world_size() > 1 and max(cfg.value("tensor_parallel_size", inference=i) for i in (False, True)) > 1
        if not split:  # chunks (the tensor-parallel split adapts LoRA layers itself): refused before anything changes
            self._check_serialized_not_adapted(emb, proj)
        if cfg.value("recompute_checkpoint_every_layer"):
            if not getattr(self.model, "supports_gradient_checkpointing", False):
                raise IncompatibleIPUConfigError(
                    f"recompute_checkpoint_every_layer: {type(self.model).__name__} does not support activation "
                    "checkpointing; set it to false"
                )
            # transformers' own mechanism: its layers are GradientCheckpointingLayer instances. The method
            # was renamed in transformers 5.2x; older 5.x only have the gradient_* name.
            kwargs = {"use_reentrant": False}
            if hasattr(self.model, "activation_checkpointing_enable"):
                self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
                self._undo.append(self.model.activation_checkpointing_disable)
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
                self._undo.append(self.model.gradient_checkpointing_disable)
        if (emb > 1 or proj > 1) and split:
            # Optimum Graphcore's split over IPUs, made real: the tensor-parallel plan splits the embedding and the
            # output projection by vocabulary rows over the stage's devices; chunks on top would hide them from it
            logger.warning_once(
                "embedding / projection serialization: realised as the vocabulary split over the tensor_parallel_size "
                "devices of each stage (the embedding and output projection split by rows), not as chunks"
            )
        elif emb > 1 or proj > 1:
            self._undo.append(swap_serialized(self.model, embedding_factor=emb, projection_factor=proj))
        self._parallelized = True

    def _check_serialized_not_adapted(self, embedding_factor: int, projection_factor: int) -> None:
        """A serialization factor and an adapter (`peft`'s LoRA layer, or its `modules_to_save` copy) on the module
        it serializes: the chunked module would drop the adapter's update (and `peft` cannot adapt a chunked module,
        when serialized first), so the pair is refused in one line naming the module, the fields and the fix."""
        _, stock = unwrap_adapters(self.model)
        for accessor, factor, kind in (
            ("get_input_embeddings", embedding_factor, "embedding"),
            ("get_output_embeddings", projection_factor, "projection"),
        ):
            getter = getattr(stock, accessor, None)
            try:
                module = getter() if factor > 1 and callable(getter) else None
            except NotImplementedError:  # transformers' accessors raise for models without token embeddings
                module = None
            # peft's tuner layers hold the adapted module as `base_layer`, its modules_to_save copies as
            # `original_module` (read from the wrapper's attributes: peft is never imported here)
            if module is None or not (hasattr(module, "base_layer") or hasattr(module, "original_module")):
                continue
            name = next((n for n, m in stock.named_modules() if m is module), type(module).__name__)
            fields = _serializing_fields(self.ipu_config, kind)
            given = " and ".join(f"`{field}` ({value})" for field, value in fields)
            fix = " and ".join(f"remove `{f}`" if "splits" in f else f"set `{f}` to 1" for f, _ in fields)
            what = "target_modules (--lora_target_modules in the examples)"
            what = what if hasattr(module, "base_layer") else "modules_to_save"
            raise IncompatibleIPUConfigError(
                f"`{name}` carries a peft adapter ({type(module).__module__}.{type(module).__name__}) and {given} "
                f"serialize{'s' if len(fields) == 1 else ''} it, which would drop the adapter's update: {fix}, or "
                f"leave `{name.split('.')[-1]}` out of the adapter's {what}"
            )

    def quantize_linears(self) -> list[str]:
        """Optimum Graphcore's `use_group_quantized_linears`: the weight of every linear layer of the pipeline layers
        (attention projections and feed-forward layers; for Whisper, of the encoder and decoder layers, as there)
        stored in int8, one scale per group of 128 input features, by `torchao`
        (`optimum_ipu.runtime.quantization`). The embeddings, convolutions, heads and the output projection (tied to
        the token embedding) keep their precision. Lossy and in place: `deparallelize()` and `save_pretrained` keep
        the int8 weights (saved as `torchao` safetensors that `from_pretrained` reads back quantized).

        Returns:
            `list[str]`: the dotted names (in `self.model`) of the linear layers whose weight is int8.
        """
        self._check_quantizable()
        names = quantize_linear_weights(self.model, self.layer_paths())
        logger.info(f"use_group_quantized_linears: {len(names)} linear weights in int8 (torchao, per group)")
        return names

    def _check_quantizable(self) -> None:
        """torchao installed, the model in inference mode: one line naming the fix otherwise."""
        require_torchao()
        if self.training:
            raise IncompatibleIPUConfigError(
                "use_group_quantized_linears=True: int8 weights are for inference and cannot be trained; call "
                ".eval() on the model first"
            )

    def _balance_auto_layers(self) -> None:
        """`layers_per_ipu: "auto"`: the split that balances the stages, from each layer's cost measured here."""
        cfg = self.ipu_config
        for field in cfg.__dict__["auto_layers"]:  # more stages than layers: said before minutes of measuring
            layers_per_stage(cfg, self.num_layers, inference=field.startswith("inference_"))
        fields = measured_auto_fields(cfg)  # an "auto" of one stage is its wildcard: every layer, nothing to measure
        if not fields:
            return
        if any(param.is_meta for param in self.model.parameters()):  # a model that holds one stage only
            name = getattr(getattr(self.model, "config", None), "name_or_path", "")
            check_auto_on_stage_processes(cfg, name or "MODEL")
        if self.plan.input_kind != "tokens":
            raise IncompatibleIPUConfigError(
                f'IPUConfig field `{fields[0]}`: "auto" measures token models only; {self.class_name} takes '
                f"{self.plan.input_kind}: give the list (optimum-ipu config balance prints one)"
            )
        stages = {f: len(cfg.__dict__[f]) for f in fields}
        resolved = auto_layers_per_ipu(self.model, self.stage_cut(), fields, stages, cfg.gradient_accumulation_steps)
        for field, counts in resolved.items():
            cfg._set_field(field, counts, keep_auto=True)
            logger.warning(f'{field} "auto": {counts}, balanced from each layer\'s cost measured here')

    def deparallelize(self) -> nn.Module:
        """Undo `parallelize()` and return the stock model (same module objects, same `state_dict`)."""
        while self._undo:
            self._undo.pop()()
        self._parallelized = False
        return self.model

    def train(self, mode: bool = True) -> PipelinedModel:
        """Like `nn.Module.train`: `eval()` selects the inference layout (`inference_*` values) for this model.
        The `IPUConfig`, which other models and trainers may share, is left as it is."""
        return super().train(mode)

    # ------------------------------------------------------------------ running
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The stock model's forward. In training with labels and `projection_serialization_factor > 1`, the
        output projection and its cross-entropy run in chunks and `logits` is `None` (never built whole)."""
        # a model of the user's own (a plain `nn.Module`, on a derived plan) has no `get_output_embeddings`
        projection = getattr(self.model, "get_output_embeddings", lambda: None)()
        kind = self.plan.loss_kind(self.class_name)
        if not (self.training and kind and kwargs.get("labels") is not None and hasattr(projection, "capturing")):
            return self.model(*args, **kwargs)
        labels = kwargs.pop("labels")
        if self.model.config.is_encoder_decoder and kwargs.get("decoder_input_ids") is None:
            # what the model does itself when it is given labels (T5: labels shifted right)
            kwargs["decoder_input_ids"] = self.model.prepare_decoder_input_ids_from_labels(labels=labels)
        with projection.capturing():
            output = self.model(*args, **kwargs)
        hidden = projection.captured
        if kind == "causal":  # position t predicts token t + 1
            hidden, labels = hidden[..., :-1, :], labels[..., 1:]
        loss = chunked_cross_entropy(
            hidden.reshape(-1, hidden.shape[-1]),
            projection.weight,
            projection.bias,
            labels.reshape(-1),
            chunks=projection.factor,
        )
        fields = {k: v for k, v in output.items() if k not in ("loss", "logits")}
        return type(output)(loss=loss, **fields)

    def save_pretrained(self, save_directory: str, **kwargs: Any) -> None:
        """Save the stock model (`transformers` layout, safetensors) and `ipu_config.json` beside it."""
        was_parallelized = self._parallelized
        self.deparallelize()
        try:
            self.model.save_pretrained(save_directory, **kwargs)
            self.ipu_config.save_pretrained(save_directory)
        finally:
            if was_parallelized:
                self.parallelize()

    def detachFromDevice(self) -> None:  # noqa: N802 (Optimum Graphcore's, poptorch's, name)
        """Optimum Graphcore's release of the IPUs a model held between calls. A model here holds no device for
        itself (its memory is freed with it), so there is nothing to release."""

    def __repr__(self) -> str:
        return f"PipelinedModel({self.describe_layout()})"


def to_pipelined(model: nn.Module, ipu_config: IPUConfig | str, parallelize: bool = False) -> PipelinedModel:
    """Wrap a `transformers` model with the stage layout of `ipu_config`.

    Args:
        model (`transformers.PreTrainedModel`): an instance of a registered class.
        ipu_config (`IPUConfig` or `str`): a config, or anything `IPUConfig.from_pretrained` accepts.
        parallelize (`bool`, *optional*, defaults to `False`): also call `parallelize()`.

    Example:

    ```python
    >>> from transformers import BertConfig, BertForQuestionAnswering
    >>> from optimum_ipu import IPUConfig, to_pipelined
    >>> model = BertForQuestionAnswering(BertConfig(num_hidden_layers=4))
    >>> pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[0, -1, -1])).parallelize()
    >>> print(pipelined.describe_layout())
    BertForQuestionAnswering (4 layers):
      ipu0: embeddings
      ipu1: layers 0-1
      ipu2: layers 2-3 + heads
    ```
    """
    if not isinstance(ipu_config, IPUConfig):
        ipu_config = IPUConfig.from_pretrained(ipu_config)
    if isinstance(model, PipelinedModel):
        raise IncompatibleIPUConfigError("to_pipelined: the model is already pipelined; pass `pipelined.model`")
    pipelined = PipelinedModel(model, ipu_config)
    pipelined.train(model.training)
    return pipelined.parallelize() if parallelize else pipelined
