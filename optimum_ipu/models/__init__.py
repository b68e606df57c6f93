"""Model registry: `transformers` class -> `StagePlan` (registered or derived), and the pipelined wrapper.

Optimum Graphcore's module paths (`optimum_ipu.models.bert`, ...) are served from the registry
(`optimum_ipu.models.class_modules`).
"""

from .class_modules import install
from .plans import (
    StagePlan,
    plan_for_class,
    plan_for_config,
    plan_for_model,
    register_stage_plan,
    registered_classes,
    registered_plans,
)

install()

__all__ = [
    "StagePlan",
    "plan_for_class",
    "plan_for_config",
    "plan_for_model",
    "register_stage_plan",
    "registered_classes",
    "registered_plans",
]
