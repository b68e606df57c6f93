"""Model registry: `transformers` class -> `StagePlan`, and the pipelined wrapper built from it."""

from .plans import PLANS, StagePlan, plan_for_class, plan_for_config, registered_classes

__all__ = ["PLANS", "StagePlan", "plan_for_class", "plan_for_config", "registered_classes"]
