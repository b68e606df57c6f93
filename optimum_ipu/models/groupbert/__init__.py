"""GroupBERT (`optimum_ipu.models.groupbert`, Optimum Graphcore's `optimum.graphcore.models.groupbert`): its config and
models, known to `transformers`' auto classes once this module is imported (`AutoConfig.from_pretrained` of a
`model_type: "groupbert"` folder, `AutoModelForMaskedLM`, ...), and its `Pipelined<Class>` names, served from the stage
plan registry as every family's (`optimum_ipu.models.class_modules`). `optimum_ipu`'s own auto classes and stage plan
lookups import it on first use.
"""

from __future__ import annotations

from typing import Any

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
from .registration import register_groupbert

register_groupbert()


def __getattr__(name: str) -> Any:  # `PipelinedGroupBertForPreTraining`, ...: generated from the registry
    from ..class_modules import resolve

    return resolve("groupbert", name)


__all__ = [
    "HEADS",
    "GroupBertConfig",
    "GroupBertForMaskedLM",
    "GroupBertForMultipleChoice",
    "GroupBertForPreTraining",
    "GroupBertForQuestionAnswering",
    "GroupBertForSequenceClassification",
    "GroupBertForTokenClassification",
    "GroupBertModel",
]
