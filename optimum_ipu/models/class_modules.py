"""Optimum Graphcore's module paths for its class names, served from the stage plan registry: no file per family.

Code written for Optimum Graphcore imports `from optimum.graphcore.models.bert import PipelinedBertForQuestionAnswering`
(or `...models.bert.modeling_bert`); with `optimum.graphcore` changed to `optimum_ipu`, the same line works. For every
family of the registry (its `model_type`, spelled as `transformers.models.<name>`: `deberta_v2`), an import finder
(added by `optimum_ipu.models`, `install()`) makes `optimum_ipu.models.<name>`, `optimum_ipu.models.<name>.
modeling_<name>` (and its plan's `graphcore_submodules`) on import: each serves `Pipelined<Class>` for every registered
class of the family, made on first use by `optimum_ipu.models.pipelined_classes.pipelined_class`. A family registered
later (`register_stage_plan`) is served too. Optimum Graphcore's few other names at these paths are facts of the
family's plan, as its tree has them (commit b8cd6e096a11139745d519aedea4a9414395f093, `optimum/graphcore/models/*`):
`graphcore_aliases`, `graphcore_extras`, and the names of its `model_module` where the model is its own (GroupBERT).

This module imports no torch (the registry's families do, when a family module is first imported).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from .plans import registered_plans
from .stage_plan import StagePlan

PACKAGE = "optimum_ipu.models"


def _plans_by_module() -> dict[str, list[StagePlan]]:
    """Every registered plan under its family's module name (`transformers.models.<name>`'s spelling)."""
    from .pipelined_classes import module_name  # transformers' spelling of a model type

    by_module: dict[str, list[StagePlan]] = {}
    for plan in registered_plans():
        by_module.setdefault(module_name(plan.family), []).append(plan)
    return by_module


def served_classes() -> dict[str, dict[str, str]]:
    """Every served module's class names: module name -> `Pipelined...` name -> `transformers` class name (the
    registered classes, and the plans' `graphcore_aliases`)."""
    served: dict[str, dict[str, str]] = {}
    for module, plans in _plans_by_module().items():
        names = served.setdefault(module, {})
        for plan in plans:
            names.update({f"Pipelined{c}": c for c in plan.classes})
        for plan in plans:
            names.update(plan.graphcore_aliases)
    return served


def _extras(module: str) -> dict[str, str]:
    """The module's plans' `graphcore_extras`: Optimum Graphcore's name -> the `transformers` attribute."""
    return {k: v for plan in _plans_by_module().get(module, ()) for k, v in plan.graphcore_extras.items()}


def _submodules(module: str) -> set[str]:
    """The module's plans' `graphcore_submodules` (besides `modeling_<module>`)."""
    return {name for plan in _plans_by_module().get(module, ()) for name in plan.graphcore_submodules}


def served_modules() -> set[str]:
    """The names `optimum_ipu.models.<name>` serves: the registry's families."""
    return set(_plans_by_module())


def served_names(module: str) -> list[str]:
    """The names `optimum_ipu.models.<module>` serves (its `__all__`)."""
    return sorted({*served_classes().get(module, {}), *_extras(module), *_own_model_names(module)})


def _own_model_names(module: str) -> list[str]:
    """The names of the module's plans' own `model_module` (GroupBERT's `modeling_groupbert.__all__`), imported when
    first asked for: it imports torch."""
    names: list[str] = []
    for own in dict.fromkeys(p.model_module for p in _plans_by_module().get(module, ()) if p.model_module):
        names += getattr(importlib.import_module(own), "__all__", [])
    return names


def resolve(module: str, name: str) -> Any:
    """`optimum_ipu.models.<module>.<name>`: a generated `Pipelined<Class>`, one of the plans' `graphcore_extras`, or
    a name of their `model_module`.

    Raises:
        `AttributeError`: a name the module does not serve, listing those it does.
    """
    import transformers

    from .pipelined_classes import pipelined_class, transformers_class

    extras = _extras(module)
    if name in extras:
        return getattr(transformers, extras[name])
    for plan in _plans_by_module().get(module, ()):
        if plan.model_module and name in getattr(importlib.import_module(plan.model_module), "__all__", ()):
            return getattr(importlib.import_module(plan.model_module), name)
    class_name = served_classes().get(module, {}).get(name)
    model_class = transformers_class(class_name) if class_name else None
    if model_class is None:
        raise AttributeError(
            f"module '{PACKAGE}.{module}' has no attribute {name!r}; it serves {', '.join(served_names(module))} "
            "(to_pipelined(model, ipu_config) takes a model of any class whose base holds one list of layers)"
        )
    return pipelined_class(model_class)


def resolve_anywhere(name: str) -> Any:
    """A `Pipelined<Class>` name of any served module: Optimum Graphcore's `optimum.graphcore` exported them at the top
    too (`from optimum.graphcore import PipelinedBertForQuestionAnswering`), served as `optimum_ipu.<name>`.

    Raises:
        `AttributeError`: no served module has it.
    """
    for module, names in served_classes().items():
        if name in names:
            return resolve(module, name)
    raise AttributeError(f"module 'optimum_ipu' has no attribute {name!r}")


class FamilyModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `optimum_ipu.models.<family>` and its `modeling_<family>` (after the files of the package: a real module
    of that name wins) and makes them: a module whose attributes `resolve` gives."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if not fullname.startswith(f"{PACKAGE}."):
            return None
        parts = fullname[len(PACKAGE) + 1 :].split(".")
        if len(parts) > 2 or (len(parts) == 2 and parts[1] not in (f"modeling_{parts[0]}", *_submodules(parts[0]))):
            return None
        if parts[0] not in served_modules():
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=len(parts) == 1)

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        family = module.__name__[len(PACKAGE) + 1 :].split(".")[0]
        module.__doc__ = (
            f"Optimum Graphcore's `optimum.graphcore.models.{family}` names, generated from the stage plan registry "
            "(`optimum_ipu.models.class_modules`)."
        )
        module.__all__ = served_names(family)
        module.__getattr__ = lambda name: resolve(family, name)
        module.__dir__ = lambda: sorted({*module.__dict__, *served_names(family)})


def install() -> None:
    """Add `FamilyModuleFinder` to `sys.meta_path` once (last: the package's own files are found first)."""
    if not any(getattr(finder, "serves_optimum_ipu_families", False) for finder in sys.meta_path):
        finder = FamilyModuleFinder()
        finder.serves_optimum_ipu_families = True
        sys.meta_path.append(finder)


__all__ = [
    "FamilyModuleFinder",
    "install",
    "resolve",
    "resolve_anywhere",
    "served_classes",
]
