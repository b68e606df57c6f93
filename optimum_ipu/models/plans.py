"""The stage plan registry: `transformers` class -> `StagePlan` (`optimum_ipu.models.stage_plan`).

Nothing outside `optimum_ipu/models/` branches on a family or a class name: it asks the plan found here. The
built-in plans are declared in `optimum_ipu/models/families/` (one module per domain) and registered on first
lookup; a user adds a family with `register_stage_plan(StagePlan(...))` (see `docs/adding_a_family.md`). A class
without a plan gets a derived one (`optimum_ipu.models.derived`) when its base model holds one list of
identical layers, or an encoder and a decoder list.

This module imports no torch (the families and the derived plans do, so they are loaded on first lookup):
`optimum_ipu` imports it eagerly.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ..errors import IncompatibleIPUConfigError
from ..runtime.adapters import unwrap_adapters
from .stage_plan import (
    INPUT_KINDS,
    VOCABULARY_LOSS_KINDS,
    StagePlan,
    no_position_offset,
    position_offset_after_padding,
)

logger = logging.getLogger(__name__)

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
    from .families import BUILTIN_PLANS  # torch: on first lookup, so that `import optimum_ipu` stays torch-free

    for plan in BUILTIN_PLANS:
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
    """The plan of a model (seen through an adapter wrapper, `unwrap_adapters`): its class's registered plan, else
    one derived from its structure (said once)."""
    _load_builtin()
    model = unwrap_adapters(model)[1]
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
    """The first position id of a model with this config, as its plan says: what packed rows that restart their
    positions add to them, and how many fewer tokens than `max_position_embeddings` one sequence may hold.

    Args:
        config (`transformers.PretrainedConfig`): the model's config.

    Returns:
        `int`: 0 for most families; `pad_token_id + 1` for RoBERTa's numbering. A family without a registered plan
        is read from its structure, as its derived plan is (`optimum_ipu.models.derived.config_position_offset`).

    Example:

    ```python
    >>> from transformers import RobertaConfig
    >>> from optimum_ipu import position_offset
    >>> position_offset(RobertaConfig(pad_token_id=1))
    2
    ```
    """
    try:
        plan = plan_for_config(config)
    except IncompatibleIPUConfigError:
        from .derived import config_position_offset  # torch; only for families without a registered plan

        return config_position_offset(config)
    return plan.position_offset(config)


def load_model_modules() -> None:
    """Import the modules that define the model classes of registered plans where `transformers` does not
    (`StagePlan.model_module`: GroupBERT's), which registers their `model_type`s with `transformers`' auto classes,
    so that `AutoConfig.for_model("groupbert")` and `--model_type groupbert` work."""
    for module in dict.fromkeys(plan.model_module for plan in registered_plans() if plan.model_module):
        importlib.import_module(module)


def own_model_class(class_name: str) -> type | None:
    """The class of a registered class name that its plan's own `model_module` defines (GroupBERT's), else `None`
    (a `transformers` class: `getattr(transformers, class_name)`)."""
    _load_builtin()
    plan = _PLAN_BY_CLASS.get(class_name)
    if plan is None or not plan.model_module:
        return None
    return getattr(importlib.import_module(plan.model_module), class_name, None)


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


__all__ = [
    "AUTO_CLASSES",
    "INPUT_KINDS",
    "VOCABULARY_LOSS_KINDS",
    "StagePlan",
    "load_model_modules",
    "own_model_class",
    "no_position_offset",
    "position_offset",
    "position_offset_after_padding",
    "plan_for_class",
    "plan_for_config",
    "plan_for_model",
    "register_stage_plan",
    "registered_classes",
    "registered_plans",
]
