"""GroupBERT made known to `transformers`' auto classes (their public `register` API) and to the class-name lookup of
the `Pipelined<Class>` names, as Optimum Graphcore's `optimum.graphcore.models.groupbert` did on import."""

from __future__ import annotations

import transformers

from ..pipelined_classes import register_model_class
from .modeling_groupbert import (
    HEADS,
    GroupBertConfig,
    GroupBertForMaskedLM,
    GroupBertForMultipleChoice,
    GroupBertForPreTraining,
    GroupBertForQuestionAnswering,
    GroupBertForSequenceClassification,
    GroupBertForTokenClassification,
    GroupBertModel,
)

AUTO_CLASSES = {
    "AutoModel": GroupBertModel,
    "AutoModelForPreTraining": GroupBertForPreTraining,
    "AutoModelForMaskedLM": GroupBertForMaskedLM,
    "AutoModelForSequenceClassification": GroupBertForSequenceClassification,
    "AutoModelForMultipleChoice": GroupBertForMultipleChoice,
    "AutoModelForTokenClassification": GroupBertForTokenClassification,
    "AutoModelForQuestionAnswering": GroupBertForQuestionAnswering,
}


def register_groupbert() -> None:
    """Register `model_type` `"groupbert"` with `AutoConfig` and its models with the auto classes (again: a no-op)."""
    transformers.AutoConfig.register("groupbert", GroupBertConfig, exist_ok=True)
    for auto_name, model_class in AUTO_CLASSES.items():
        getattr(transformers, auto_name).register(GroupBertConfig, model_class, exist_ok=True)
    for model_class in (GroupBertModel, *HEADS):
        register_model_class(model_class)
