"""Stage plans: where each supported `transformers` family keeps its embeddings and its layers.

A plan is declarative and small; it is applied to the unmodified `transformers` model. Paths are
relative to `model.base_model` (HF's own accessor: `model.bert` for `BertForQuestionAnswering`, the model
itself for `BertModel` or T5). The input and output embeddings come from HF's own
`get_input_embeddings()` / `get_output_embeddings()`, so heads need no paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import IncompatibleIPUConfigError


@dataclass(frozen=True)
class StagePlan:
    """How one model family is cut into pipeline stages.

    Args:
        family (`str`): the `model_type` of the family's configs (`"bert"`, `"gpt2"`, ...).
        classes (`tuple[str, ...]`): the `transformers` class names this plan supports.
        embeddings (`tuple[str, ...]`): modules placed with stage 0, before the first layer.
        layers (`tuple[str, ...]`): `nn.ModuleList`s of the layers, counted together in `layers_per_ipu`
            in this order (T5: encoder blocks then decoder blocks). `"a|b"`: the first that exists.
        layer_count_fields (`tuple[str, ...]`): config attributes whose sum is the number of layers.
    """

    family: str
    classes: tuple[str, ...]
    embeddings: tuple[str, ...]
    layers: tuple[str, ...]
    layer_count_fields: tuple[str, ...] = ("num_hidden_layers",)

    def num_layers(self, config: Any) -> int:
        """Number of pipeline layers of a model with this `transformers` config."""
        total = 0
        for field in self.layer_count_fields:
            value = getattr(config, field, None)
            if field == "num_decoder_layers" and value is None:
                value = getattr(config, "num_layers", 0)  # T5: decoder depth defaults to encoder depth
            total += int(value or 0)
        return total


_ENCODER_TASKS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
)

PLANS: tuple[StagePlan, ...] = (
    StagePlan(
        family="bert",
        classes=("BertModel", "BertForPreTraining", *(f"Bert{t}" for t in _ENCODER_TASKS)),
        embeddings=("embeddings",),
        layers=("encoder.layer",),
    ),
    StagePlan(
        family="roberta",
        classes=tuple(f"Roberta{t}" for t in _ENCODER_TASKS),
        embeddings=("embeddings",),
        layers=("encoder.layer",),
    ),
    StagePlan(
        family="distilbert",
        classes=tuple(f"DistilBert{t}" for t in _ENCODER_TASKS),
        embeddings=("embeddings",),
        layers=("transformer.layer",),
    ),
    StagePlan(
        family="gpt2",
        classes=("GPT2LMHeadModel", "GPT2ForSequenceClassification", "GPT2ForTokenClassification"),
        embeddings=("wte", "wpe"),
        layers=("h",),
    ),
    StagePlan(
        family="t5",
        classes=("T5ForConditionalGeneration",),
        embeddings=("shared",),
        layers=("encoder.block", "decoder.block"),
        layer_count_fields=("num_layers", "num_decoder_layers"),
    ),
    StagePlan(
        family="vit",
        classes=("ViTForImageClassification",),
        embeddings=("embeddings",),
        layers=("layers|encoder.layer",),  # `encoder.layer` before transformers 5.2x
    ),
)

# Classes whose loss is a cross-entropy over the vocabulary from the output projection: with
# `projection_serialization_factor > 1` in training, the projection and that loss are computed in chunks.
# "causal": position t predicts token t + 1 (labels shifted, as transformers' ForCausalLMLoss does).
VOCABULARY_LOSS: dict[str, str] = {
    "BertForMaskedLM": "masked",
    "RobertaForMaskedLM": "masked",
    "DistilBertForMaskedLM": "masked",
    "GPT2LMHeadModel": "causal",
    "T5ForConditionalGeneration": "masked",
}

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
)

PLAN_BY_CLASS: dict[str, StagePlan] = {cls: plan for plan in PLANS for cls in plan.classes}
PLAN_BY_FAMILY: dict[str, StagePlan] = {plan.family: plan for plan in PLANS}


def registered_classes() -> list[str]:
    """Every `transformers` class name that has a stage plan."""
    return sorted(PLAN_BY_CLASS)


def plan_for_class(class_name: str) -> StagePlan:
    """The plan of a `transformers` class name; a clear error lists what is registered."""
    if class_name not in PLAN_BY_CLASS:
        raise IncompatibleIPUConfigError(
            f"{class_name} has no stage plan in optimum-ipu; registered classes: {', '.join(registered_classes())}"
        )
    return PLAN_BY_CLASS[class_name]


def plan_for_config(config: Any) -> StagePlan:
    """The plan of a `transformers` config, by its `model_type`."""
    model_type = getattr(config, "model_type", None)
    if model_type not in PLAN_BY_FAMILY:
        raise IncompatibleIPUConfigError(
            f"model_type {model_type!r} has no stage plan in optimum-ipu; supported families: "
            f"{', '.join(sorted(PLAN_BY_FAMILY))}"
        )
    return PLAN_BY_FAMILY[model_type]
