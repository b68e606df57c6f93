"""Stage plans: everything optimum-ipu knows about a `transformers` model family, in one declarative record.

A plan is applied to the unmodified `transformers` model. Paths are relative to `model.base_model` (HF's own
accessor: `model.bert` for `BertForQuestionAnswering`, the model itself for `BertModel` or T5). The input and
output embeddings come from HF's own `get_input_embeddings()` / `get_output_embeddings()`, so heads need no
paths. Nothing outside `optimum_ipu/models/` branches on a family or a class name: it asks the plan.

The built-in plans live in `optimum_ipu/models/families/` (one module per domain) and are registered on first
lookup; a user adds a family with `register_stage_plan(StagePlan(...))` (see `docs/adding_a_family.md`). A class
without a plan gets a derived one (`optimum_ipu.models.derived`) when its base model holds one list of
identical layers, or an encoder and a decoder list.

This module imports no torch: `optimum_ipu` imports it eagerly.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import IncompatibleIPUConfigError

logger = logging.getLogger(__name__)

INPUT_KINDS = ("tokens", "pixels", "audio")
VOCABULARY_LOSS_KINDS = ("masked", "causal")


def no_position_offset(config: Any) -> int:
    """Positions numbered from 0 (most families)."""
    return 0


def position_offset_after_padding(config: Any) -> int:
    """RoBERTa's numbering: positions start after the padding index, at `pad_token_id + 1`."""
    return (config.pad_token_id or 0) + 1


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a plan is registered once
class StagePlan:
    """How one model family is cut into pipeline stages, and every other fact the library needs about it.

    Args:
        family (`str`): the `model_type` of the family's configs (`"bert"`, `"gpt2"`, ...).
        classes (`tuple[str, ...]`): the `transformers` class names this plan supports.
        embeddings (`tuple[str, ...]`): the modules whose output becomes the first layer's hidden states (placed
            with stage 0). With stages on separate processes, only a stage that makes the hidden states holds them;
            another runs them for their output's shape only (`runtime.stage_cut.ShapeOnly`). Modules without
            parameters (rotary tables) run on every stage.
        layers (`tuple[str, ...]`): `nn.ModuleList`s of the layers, counted together in `layers_per_ipu` in this
            order (encoder-decoder: encoder list then decoder list). `"a|b"`: the first that exists (renames
            across `transformers` versions); a trailing `"?"`: optional (T5's decoder, absent in `T5EncoderModel`).
        layer_count_fields (`tuple[str, ...]`): config attributes whose sum is the number of layers (read before
            a model is built, by `optimum-ipu config check --model`).
        encoder (`str`, *optional*): encoder-decoder families: the encoder stack, whose output travels with every
            decoder stage (`layers[0]` is its layer list). `None` for encoders and decoders alone.
        input_kind (`str`, *optional*, defaults to `"tokens"`): `"tokens"`, `"pixels"` or `"audio"`.
        vocabulary_loss (`Mapping[str, str]`, *optional*): classes whose loss is a cross-entropy over the vocabulary
            from the output projection, so that `projection_serialization_factor` may compute both in chunks:
            `"masked"` (labels aligned with positions) or `"causal"` (position t predicts token t + 1).
        tied_embeddings (`bool`, *optional*, defaults to `True`): the output projection may share the input
            embedding's weight (the runtime checks the model itself; `False` says it never does).
        position_offset (`Callable[[config], int]`, *optional*): the first position id (RoBERTa: `pad_token_id + 1`),
            for packed rows that restart positions.
        packing (`bool`, *optional*, defaults to `False`): its forward takes `position_ids` and a ready 4-D mask, so
            sequences can be packed into one row (checked against running each alone in `tests/test_packing.py`).
        attention_dropout_field (`str`, *optional*): the config field of its attention dropout.
        sequence_head (`Callable`, *optional*): `(model, first_token_states) -> logits` of its
            `...ForSequenceClassification` head applied to each packed sequence's first token (packing only).
        embeddings_feed_hidden_states_only (`bool`, *optional*, defaults to `True`): the embeddings' output reaches
            the rest of the model only as the first layer's hidden states, so a stage that receives those may run them
            for their shape only and not hold them. `False` where the output carries an embedding's output too
            (Wav2Vec2's `extract_features`): every stage then holds and runs them.
        layer_stand_in (`Callable`, *optional*): `(layer) -> nn.Module` standing in for a layer of another stage
            when the stages run apart, where a bare pass-through would change the numbers (T5's first block
            computes the position bias that the others share); its `borrowed_parameters()`, if any, are held by
            every stage that runs it.
        process_stages (`bool`, *optional*, defaults to `True`): stages may run on separate processes.
        process_stages_reason (`str`, *optional*): why not, when they may not.
        derived (`bool`, *optional*, defaults to `False`): derived from the model's structure, not registered.
    """

    family: str
    classes: tuple[str, ...]
    embeddings: tuple[str, ...]
    layers: tuple[str, ...]
    layer_count_fields: tuple[str, ...] = ("num_hidden_layers",)
    encoder: str | None = None
    input_kind: str = "tokens"
    vocabulary_loss: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    tied_embeddings: bool = True
    position_offset: Callable[[Any], int] = no_position_offset
    packing: bool = False
    attention_dropout_field: str = "attention_dropout"
    sequence_head: Callable[[Any, Any], Any] | None = None
    embeddings_feed_hidden_states_only: bool = True
    layer_stand_in: Callable[[Any], Any] | None = None
    process_stages: bool = True
    process_stages_reason: str = ""
    derived: bool = False

    def __post_init__(self) -> None:
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"StagePlan {self.family}: input_kind {self.input_kind!r}; expected one of {INPUT_KINDS}")
        if not self.layers:
            raise ValueError(f"StagePlan {self.family}: layers is empty; name the model's layer list(s)")
        if self.encoder is not None and len(self.layers) != 2:
            raise ValueError(f"StagePlan {self.family}: an encoder-decoder plan names 2 layer lists (encoder, decoder)")
        unknown = {k: v for k, v in self.vocabulary_loss.items() if v not in VOCABULARY_LOSS_KINDS}
        if unknown:
            raise ValueError(f"StagePlan {self.family}: vocabulary_loss {unknown}; kinds are {VOCABULARY_LOSS_KINDS}")
        object.__setattr__(self, "vocabulary_loss", MappingProxyType(dict(self.vocabulary_loss)))

    def num_layers(self, config: Any) -> int:
        """Number of pipeline layers of a model with this `transformers` config (before it is built)."""
        total = 0
        for name in self.layer_count_fields:
            value = getattr(config, name, None)
            if name == "num_decoder_layers" and value is None:
                value = getattr(config, "num_layers", 0)  # T5: decoder depth defaults to encoder depth
            total += int(value or 0)
        return total

    def loss_kind(self, class_name: str) -> str | None:
        """`"masked"` / `"causal"` when the class's loss is a vocabulary cross-entropy, else `None`."""
        return self.vocabulary_loss.get(class_name)


_PLAN_BY_CLASS: dict[str, StagePlan] = {}
_builtin_loaded = False


def register_stage_plan(plan: StagePlan, *, replace: bool = False) -> StagePlan:
    """Register a plan for its classes, so that `to_pipelined` accepts them.

    Args:
        plan (`StagePlan`): the family's plan.
        replace (`bool`, *optional*, defaults to `False`): replace the plans already registered for these classes
            (otherwise a class registered twice is an error).

    Example:

    ```python
    >>> from optimum_ipu.models import StagePlan, register_stage_plan
    >>> register_stage_plan(StagePlan(family="electra", classes=("ElectraForMaskedLM",),
    ...                               embeddings=("embeddings",), layers=("encoder.layer",)))
    ```
    """
    _load_builtin()
    taken = [c for c in plan.classes if c in _PLAN_BY_CLASS and _PLAN_BY_CLASS[c] is not plan]
    if taken and not replace:
        raise ValueError(f"register_stage_plan: {', '.join(taken)} already have a plan; pass replace=True")
    for class_name in plan.classes:
        _PLAN_BY_CLASS[class_name] = plan
    return plan


def _load_builtin() -> None:
    """Register the built-in families once (their modules import torch, so not at import time)."""
    global _builtin_loaded
    if _builtin_loaded:
        return
    _builtin_loaded = True
    families = importlib.import_module(".families", __package__)
    for plan in families.BUILTIN_PLANS:
        for class_name in plan.classes:
            _PLAN_BY_CLASS.setdefault(class_name, plan)


def registered_plans() -> list[StagePlan]:
    """Every registered plan, once each, in registration order."""
    _load_builtin()
    return list(dict.fromkeys(_PLAN_BY_CLASS.values()))


def registered_classes() -> list[str]:
    """Every `transformers` class name that has a registered stage plan."""
    _load_builtin()
    return sorted(_PLAN_BY_CLASS)


def plan_for_class(class_name: str) -> StagePlan:
    """The registered plan of a `transformers` class name; a clear error lists what is registered."""
    _load_builtin()
    if class_name not in _PLAN_BY_CLASS:
        raise IncompatibleIPUConfigError(
            f"{class_name} has no stage plan in optimum-ipu; registered classes: {', '.join(registered_classes())}"
        )
    return _PLAN_BY_CLASS[class_name]


def plan_for_model(model: Any) -> StagePlan:
    """The plan of a model: its class's registered plan, else one derived from its structure (said once)."""
    _load_builtin()
    name = type(model).__name__
    if name in _PLAN_BY_CLASS:
        return _PLAN_BY_CLASS[name]
    from .derived import derive_plan  # torch; only for unregistered classes

    return derive_plan(model)


def plan_for_config(config: Any) -> StagePlan:
    """The plan of a `transformers` config: by its first architecture, else the first plan of its `model_type`."""
    _load_builtin()
    for name in getattr(config, "architectures", None) or ():
        if name in _PLAN_BY_CLASS:
            return _PLAN_BY_CLASS[name]
    model_type = getattr(config, "model_type", None)
    for plan in registered_plans():
        if plan.family == model_type:
            return plan
    families = sorted({plan.family for plan in registered_plans()})
    raise IncompatibleIPUConfigError(
        f"model_type {model_type!r} has no stage plan in optimum-ipu; registered families: {', '.join(families)} "
        "(a model whose base holds one list of identical layers gets a derived plan when it is built)"
    )


def position_offset(config: Any) -> int:
    """The first position id of a model with this config, as its plan says (0 for a family without a plan)."""
    try:
        return plan_for_config(config).position_offset(config)
    except IncompatibleIPUConfigError:
        return 0


# `optimum_ipu.AutoModelFor*`: same names as transformers' auto classes, returning pipelined models.
AUTO_CLASSES = (
    "AutoModel",
    "AutoModelForPreTraining",
    "AutoModelForMaskedLM",
    "AutoModelForCausalLM",
    "AutoModelForSeq2SeqLM",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoModelForQuestionAnswering",
    "AutoModelForMultipleChoice",
    "AutoModelForImageClassification",
    "AutoModelForAudioClassification",
    "AutoModelForCTC",
    "AutoModelForSpeechSeq2Seq",
)
