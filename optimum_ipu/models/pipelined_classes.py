"""Optimum Graphcore's `Pipelined<Class>` classes, generated from the stage plan registry.

Optimum Graphcore forked one modeling file per family: `PipelinedBertForQuestionAnswering` subclassed
`BertForQuestionAnswering` and placed its modules on IPUs in its own `parallelize()`. Here each such name is a class
made on first use by `pipelined_class(BertForQuestionAnswering)`: a `PipelinedModel` (the stock model, unmodified,
laid out by its family's `StagePlan`) with Optimum Graphcore's constructors (`from_transformers`,
`from_pretrained_transformers`, `from_model`), `get_transformers_cls()`, an `ipu_config` that must be an `IPUConfig`,
and `parallelize()` / `deparallelize()` that return the model itself, as there. Attributes it does not have are read
from the stock model (`pipelined.bert`, `pipelined.num_parameters()`), since Optimum Graphcore's object was that model.
`optimum_ipu.models.class_modules` serves the names at Optimum Graphcore's module paths.

What differs: the object wraps the stock model instead of being one, so `isinstance(pipelined,
BertForQuestionAnswering)` is false, its `state_dict()` keys start with `model.` (`pipelined.model.state_dict()` has
the stock keys, and `save_pretrained` writes them), and a class decorated with `register` is replaced by the generated
one: its own `parallelize()` placed modules with poptorch, which the stage plan does here.
"""

from __future__ import annotations

import copy
import logging
import types
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import transformers
from torch import nn

from ..config import IPUConfig
from .derived import derive_plan
from .pipelined import PipelinedModel
from .plans import own_model_class, register_stage_plan, registered_classes, unwrap_adapters
from .stage_plan import StagePlan

logger = logging.getLogger(__name__)

PACKAGE = "optimum_ipu.models"
# classes made known by `register` that `transformers` does not export: name -> class
_USER_CLASSES: dict[str, type] = {}
_GENERATED: dict[type, type[PipelineMixin]] = {}
_METHODS = (types.FunctionType, classmethod, staticmethod, property)


def module_name(model_type: str) -> str:
    """The module name of a `model_type`, as `transformers.models.<name>` spells it (`"deberta-v2"` ->
    `"deberta_v2"`); Optimum Graphcore's `optimum.graphcore.models.<name>` used the same names."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    return model_type_to_module_name(model_type)


def transformers_class(class_name: str) -> type | None:
    """The model class of a registered class name: `transformers`' own, one of its plan's own `model_module`
    (GroupBERT's: not `transformers`' attributes), or one made known by `register`."""
    found = _USER_CLASSES.get(class_name) or getattr(transformers, class_name, None)
    return found or own_model_class(class_name)


class PipelineMixin(PipelinedModel):
    """The base of every `Pipelined<Class>` (Optimum Graphcore's `optimum.graphcore.modeling_utils.PipelineMixin`).

    Args:
        model (`transformers.PreTrainedModel` or `transformers.PretrainedConfig`): an instance of the class's
            `transformers` class, used as it is (not copied); or a config, to build one with random weights, as
            `Pipelined<Class>(config)` did there.
        ipu_config (`IPUConfig`, *optional*): the layout; defaults to `IPUConfig()` (one stage, one replica).

    Example:

    ```python
    >>> from optimum_ipu import IPUConfig
    >>> from optimum_ipu.models.bert import PipelinedBertForQuestionAnswering
    >>> pipelined = PipelinedBertForQuestionAnswering.from_transformers(model, IPUConfig(layers_per_ipu=[2, 2]))
    >>> outputs = pipelined.parallelize()(**inputs)
    ```
    """

    _transformers_cls: ClassVar[type | None] = None

    def __init__(self, model: nn.Module | transformers.PretrainedConfig, ipu_config: IPUConfig | None = None) -> None:
        expected = self.get_transformers_cls()
        if isinstance(model, transformers.PretrainedConfig) and expected is not None:
            model = expected(model)
        stock = unwrap_adapters(model)[1]
        if expected is not None and not isinstance(stock, expected):
            raise TypeError(
                f"{type(self).__name__} pipelines a {expected.__name__}, not a {type(stock).__name__}: use "
                f"Pipelined{type(stock).__name__} or to_pipelined(model, ipu_config)"
            )
        super().__init__(model, IPUConfig() if ipu_config is None else ipu_config)

    @property
    def ipu_config(self) -> IPUConfig:
        """The model's `IPUConfig` (set it with an `IPUConfig`, as there)."""
        return self.__dict__["_ipu_config"]

    @ipu_config.setter
    def ipu_config(self, value: IPUConfig) -> None:
        if not isinstance(value, IPUConfig):
            raise TypeError(
                f"ipu_config must be an IPUConfig, not {type(value).__name__} ({value!r}): "
                "pass IPUConfig.from_pretrained(...) of it"
            )
        self.__dict__["_ipu_config"] = value

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # nn.Module's: parameters, buffers, submodules
        except AttributeError:
            model = self.__dict__.get("_modules", {}).get("model")
            if model is None or name.startswith("__"):
                raise
            return getattr(model, name)  # Optimum Graphcore's object was the stock model: read its attributes

    # ------------------------------------------------------------------ Optimum Graphcore's constructors
    @classmethod
    def get_transformers_cls(cls) -> type | None:
        """The `transformers` class this class pipelines (`BertForQuestionAnswering` for
        `PipelinedBertForQuestionAnswering`)."""
        return cls._transformers_cls

    @classmethod
    def from_transformers(cls, model: nn.Module, ipu_config: IPUConfig | str) -> PipelineMixin:
        """A pipelined copy of `model` (its weights, config and training mode; `model` is left as it is).

        Args:
            model (`transformers.PreTrainedModel`): an instance of `get_transformers_cls()`.
            ipu_config (`IPUConfig` or `str`): the layout (copied), or anything `IPUConfig.from_pretrained` takes.
        """
        pipelined = cls(copy.deepcopy(model), _copied_config(ipu_config))
        pipelined.train(model.training)
        return pipelined

    @classmethod
    def from_pretrained_transformers(
        cls, model_name_or_path: str, ipu_config: IPUConfig | str, *model_args: Any, **kwargs: Any
    ) -> PipelineMixin:
        """Load with `get_transformers_cls().from_pretrained(model_name_or_path, *model_args, **kwargs)` and pipeline.

        Under `torchrun` with the config's stages on separate processes, each process reads only its stage's tensors
        (`optimum_ipu.models.stage_loading.load_stage`), as `AutoModelFor*.from_pretrained` does.
        """
        from .stage_loading import load_stage, loads_stage_only  # torch.distributed: only when loading

        ipu_config = _copied_config(ipu_config)
        if loads_stage_only(ipu_config) and not model_args:
            stock = load_stage(cls.get_transformers_cls(), model_name_or_path, ipu_config, **kwargs).model
        else:
            stock = cls.get_transformers_cls().from_pretrained(model_name_or_path, *model_args, **kwargs)
        return cls(stock, ipu_config)

    @classmethod
    def from_pretrained(
        cls, model_name_or_path: str, *model_args: Any, ipu_config: IPUConfig | str | None = None, **kwargs: Any
    ) -> PipelineMixin:
        """`from_pretrained_transformers` with the `ipu_config.json` saved beside the model (else `IPUConfig()`) when
        no `ipu_config` is given: there this was `transformers`' own `from_pretrained`, before `ipu_config` was set."""
        if ipu_config is None:
            from .auto import repo_ipu_config

            ipu_config = repo_ipu_config(model_name_or_path, **kwargs) or IPUConfig()
        return cls.from_pretrained_transformers(model_name_or_path, ipu_config, *model_args, **kwargs)

    @classmethod
    def from_model(cls, model: nn.Module) -> PipelineMixin:
        """A pipelined copy of `model` with the default `IPUConfig()` (one stage), as there."""
        return cls.from_transformers(model, IPUConfig())

    def parallelize(self, for_generation: bool = False, **kwargs: Any) -> PipelineMixin:
        """`PipelinedModel.parallelize`; returns the model itself."""
        return super().parallelize(for_generation, **kwargs)

    def deparallelize(self) -> PipelineMixin:
        """Undo `parallelize()` and return the model itself, as there (`self.model` is the stock model)."""
        super().deparallelize()
        return self


def _copied_config(ipu_config: IPUConfig | str) -> IPUConfig:
    return copy.deepcopy(ipu_config) if isinstance(ipu_config, IPUConfig) else IPUConfig.from_pretrained(ipu_config)


def pipelined_class(transformers_cls: type) -> type[PipelineMixin]:
    """The `Pipelined<Class>` class of a `transformers` model class (made once, then the same class object).

    Its module is `optimum_ipu.models.<family>`, Optimum Graphcore's path with `optimum.graphcore` changed, so that
    it pickles by name. The class needs no registered plan to be made; a model it wraps gets its class's plan, or a
    derived one.

    Args:
        transformers_cls (`type`): a `transformers.PreTrainedModel` subclass.
    """
    if transformers_cls not in _GENERATED:
        name = f"Pipelined{transformers_cls.__name__}"
        model_type = getattr(getattr(transformers_cls, "config_class", None), "model_type", "") or ""
        attributes = {
            "__module__": f"{PACKAGE}.{module_name(model_type)}" if model_type else PACKAGE,
            "__qualname__": name,
            "__doc__": f"`{transformers_cls.__name__}` laid out in pipeline stages by its stage plan "
            "(Optimum Graphcore's class of this name). See `optimum_ipu.models.pipelined_classes.PipelineMixin`.",
            "_transformers_cls": transformers_cls,
        }
        _GENERATED[transformers_cls] = type(name, (PipelineMixin,), attributes)
    return _GENERATED[transformers_cls]


def _original_class(cls: type) -> type:
    """Optimum Graphcore's rule: the first base of a `Pipelined...` class that is not `PipelineMixin`."""
    for base in cls.__bases__:
        if not issubclass(base, PipelinedModel):
            return base
    raise ValueError(f"Was not able to find original transformers class for {cls.__name__}: pass it to register()")


def _ensure_plan(transformers_cls: type, plan: StagePlan | None) -> None:
    """Register `plan` for the class, or derive one from an instance built on the meta device (no memory)."""
    name = transformers_cls.__name__
    if plan is not None:
        if name not in plan.classes:
            raise ValueError(f"register: the plan of family {plan.family!r} does not name {name} in its classes")
        register_stage_plan(plan, replace=True)
        return
    if name in registered_classes():
        return
    with torch.device("meta"):
        model = transformers_cls(transformers_cls.config_class())
    register_stage_plan(derive_plan(model))


def register(
    transformers_cls: type | None = None, plan: StagePlan | None = None
) -> Callable[[type], type[PipelineMixin]]:
    """Optimum Graphcore's class decorator: `@register(BertForQuestionAnswering)` over a `Pipelined...` class made
    `to_pipelined` (and so `IPUTrainer`) accept that `transformers` class. Here that is what a stage plan does, so
    `register` registers one (`register_stage_plan`) and returns the generated `Pipelined<Class>`.

    Args:
        transformers_cls (`type`, *optional*): the model class; by default the decorated class's first base that is not
            `PipelineMixin`, as there.
        plan (`StagePlan`, *optional*): the family's plan (naming the class in its `classes`). Without one, a class
            without a registered plan gets one derived from its structure (its base model's layer list), checked
            now on an instance built on the meta device; `register_stage_plan` is the direct way.

    Returns:
        A decorator returning `pipelined_class(transformers_cls)`. The decorated class's own methods are not used (its
        `parallelize()` placed modules with poptorch; here the stage plan places them), and are named once.

    Example:

    ```python
    >>> @register(ViTForImageClassification)
    ... class PipelinedViTForImageClassification(ViTForImageClassification, PipelineMixin):
    ...     pass
    >>> PipelinedViTForImageClassification.from_transformers(model, ipu_config).parallelize()
    ```
    """

    def wrapper(cls: type) -> type[PipelineMixin]:
        original = transformers_cls or _original_class(cls)
        _ensure_plan(original, plan)
        if getattr(transformers, original.__name__, None) is not original:
            _USER_CLASSES[original.__name__] = original
        own = sorted(k for k, v in vars(cls).items() if isinstance(v, _METHODS) and not k.startswith("__"))
        if own:
            logger.warning(
                "register: %s's own %s not used: the stage plan of %s places its modules here",
                cls.__name__,
                ", ".join(own),
                original.__name__,
            )
        return pipelined_class(original)

    return wrapper


__all__ = ["PipelineMixin", "module_name", "pipelined_class", "register", "transformers_class"]
