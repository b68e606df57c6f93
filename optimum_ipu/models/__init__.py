"""Model registry: `transformers` class -> `StagePlan` (registered or derived), and the pipelined wrapper.

Optimum Graphcore's module paths (`optimum_ipu.models.bert`, ...) are served from the registry
(`optimum_ipu.models.class_modules`).
"""

from .class_modules import install
from .plans import (
    StagePlan,
    load_model_modules,
    plan_for_class,
    plan_for_config,
    plan_for_model,
    position_offset,
    register_stage_plan,
    registered_classes,
    registered_plans,
)

install()

__all__ = [
    "StagePlan",
    "load_model_modules",
    "plan_for_class",
    "plan_for_config",
    "plan_for_model",
    "position_offset",
    "register_stage_plan",
    "registered_classes",
    "registered_plans",
]
