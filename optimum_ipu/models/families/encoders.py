"""Stage plans of the encoder families: BERT, RoBERTa, DistilBERT, DeBERTa (v1 and v2), MPNet, GroupBERT, LXMERT, ViT.

Each keeps its embeddings with stage 0, its `encoder.layer` list as the pipeline layers and its heads with the
last stage. Relative position tables (DeBERTa, MPNet) are computed by the encoder before its first layer, so
every stage computes them; their weights get gradients on every stage, which the runtime sums.
"""

from __future__ import annotations

from typing import Any

import torch

from ..stage_plan import StagePlan, position_offset_after_padding

_ENCODER_TASKS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
)


# Packed sequence classification (and BERT's next-sentence prediction): the model's own head applied to each
# sequence's first token ([CLS]) alone, as the model applies it to position 0 of an unpacked row. `first` is
# `(sequences, 1, hidden)`.
def _bert_head(model: Any, first: torch.Tensor) -> torch.Tensor:
    if hasattr(getattr(model, "cls", None), "seq_relationship"):  # BertForPreTraining: NSP (packed pretraining)
        return model.cls.seq_relationship(model.bert.pooler(first))
    return model.classifier(model.dropout(model.bert.pooler(first)))  # BertPooler reads position 0


def _roberta_head(model: Any, first: torch.Tensor) -> torch.Tensor:
    return model.classifier(first)  # RobertaClassificationHead reads position 0


def _distilbert_head(model: Any, first: torch.Tensor) -> torch.Tensor:
    # its forward's head step by step (the ReLU is no module of the model)
    return model.classifier(model.dropout(torch.relu(model.pre_classifier(first[:, 0]))))


# BERT's layer (RoBERTa's is the same): query, key, value and the intermediate dense column-wise, the attention
# output's and the layer output's dense row-wise (their dropout and layer norm then see whole, summed activations).
BERT_TENSOR_PARALLEL = {
    "attention.self.query": "colwise",
    "attention.self.key": "colwise",
    "attention.self.value": "colwise",
    "attention.output.dense": "rowwise",
    "intermediate.dense": "colwise",
    "output.dense": "rowwise",
}

PLANS: tuple[StagePlan, ...] = (
    StagePlan(
        family="bert",
        classes=("BertModel", "BertForPreTraining", *(f"Bert{t}" for t in _ENCODER_TASKS)),
        embeddings=("embeddings",),
        layers=("encoder.layer",),
        vocabulary_loss={"BertForMaskedLM": "masked"},
        packing=True,
        attention_dropout_field="attention_probs_dropout_prob",
        sequence_head=_bert_head,
        tensor_parallel=BERT_TENSOR_PARALLEL,
    ),
    StagePlan(
        family="roberta",
        classes=tuple(f"Roberta{t}" for t in _ENCODER_TASKS),
        embeddings=("embeddings",),
        layers=("encoder.layer",),
        vocabulary_loss={"RobertaForMaskedLM": "masked"},
        position_offset=position_offset_after_padding,
        packing=True,
        attention_dropout_field="attention_probs_dropout_prob",
        sequence_head=_roberta_head,
        onnx_fusion_model_type="bert",  # BERT's encoder: ONNX Runtime's BERT fusions apply
        tensor_parallel=BERT_TENSOR_PARALLEL,
    ),
    StagePlan(
        family="distilbert",
        classes=tuple(f"DistilBert{t}" for t in _ENCODER_TASKS),
        embeddings=("embeddings",),
        layers=("transformer.layer",),
        layer_count_fields=("n_layers",),
        vocabulary_loss={"DistilBertForMaskedLM": "masked"},
        packing=True,
        sequence_head=_distilbert_head,
        onnx_fusion_model_type="bert",
    ),
    StagePlan(
        family="deberta",
        classes=tuple(f"Deberta{t}" for t in _ENCODER_TASKS if t != "ForMultipleChoice"),
        embeddings=("embeddings",),
        layers=("encoder.layer",),
        vocabulary_loss={"DebertaForMaskedLM": "masked"},
        attention_dropout_field="attention_probs_dropout_prob",
    ),
    StagePlan(
        family="deberta-v2",
        classes=tuple(f"DebertaV2{t}" for t in _ENCODER_TASKS),
        embeddings=("embeddings",),
        layers=("encoder.layer",),
        vocabulary_loss={"DebertaV2ForMaskedLM": "masked"},
        attention_dropout_field="attention_probs_dropout_prob",
    ),
    StagePlan(
        family="mpnet",
        classes=("MPNetModel", *(f"MPNet{t}" for t in _ENCODER_TASKS)),
        embeddings=("embeddings",),
        layers=("encoder.layer",),
        vocabulary_loss={"MPNetForMaskedLM": "masked"},
        position_offset=position_offset_after_padding,
        attention_dropout_field="attention_probs_dropout_prob",
    ),
    StagePlan(
        # GroupBERT (`optimum_ipu.models.groupbert`): BERT's embeddings and heads; its encoder's closing LayerNorm
        # runs with the last stage, as GPT-2's `ln_f`. No packing: its convolution would mix packed neighbours.
        # Its model is ours (Optimum Graphcore's own code, not `transformers`'): `modeling_groupbert`.
        family="groupbert",
        classes=("GroupBertModel", "GroupBertForPreTraining", *(f"GroupBert{t}" for t in _ENCODER_TASKS)),
        model_module="optimum_ipu.models.modeling_groupbert",
        embeddings=("embeddings",),
        layers=("encoder.layer",),
        vocabulary_loss={"GroupBertForMaskedLM": "masked"},
        attention_dropout_field="attention_probs_dropout_prob",
    ),
    StagePlan(
        # The language stream's layers are the pipeline layers; the vision stream and the cross-modality layers
        # run with the last stage, which is the first to use what they compute. The encoder projects the visual
        # features (`visn_fc`) before its first language layer, so that projection is run with the embeddings, and
        # every stage holds it: its output reaches the last stage beside the hidden states, not through them.
        family="lxmert",
        classes=("LxmertModel", "LxmertForQuestionAnswering"),
        embeddings=("embeddings", "encoder.visn_fc"),
        embeddings_feed_hidden_states_only=False,
        layers=("encoder.layer",),
        layer_count_fields=("l_layers",),
        attention_dropout_field="attention_probs_dropout_prob",
    ),
    StagePlan(
        family="vit",
        classes=("ViTModel", "ViTForImageClassification"),
        embeddings=("embeddings",),
        layers=("layers|encoder.layer",),  # `encoder.layer` before transformers 5.2x
        input_kind="pixels",
        attention_dropout_field="attention_probs_dropout_prob",
    ),
)
