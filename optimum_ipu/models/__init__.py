"""Model registry: `transformers` class -> `StagePlan` (registered or derived), and the pipelined wrapper."""

from .plans import (
    StagePlan,
    plan_for_class,
    plan_for_config,
    plan_for_model,
    register_stage_plan,
    registered_classes,
    registered_plans,
)

__all__ = [
    "StagePlan",
    "plan_for_class",
    "plan_for_config",
    "plan_for_model",
    "register_stage_plan",
    "registered_classes",
    "registered_plans",
]
