"""GroupBERT (Chelombiev et al., 2021, "GroupBERT: Enhanced Transformer Architecture with Efficient Grouped
Structures"): a BERT whose layers add a grouped convolution module and a second feed-forward module, with grouped
down-projections and pre-norm residuals.

GroupBERT is not a `transformers` model: it was Optimum Graphcore's own modeling code
(`optimum/graphcore/models/groupbert/`), and checkpoints such as `Graphcore/groupbert-base-uncased` were written by it.
This module is its model for `transformers` (a `BertConfig` with three more fields, BERT's embeddings, pooler and
heads, GroupBERT's layers), with the same parameter names, so those checkpoints load; nothing here is a copy of a
`transformers` model. Importing it registers `model_type` `"groupbert"` with `transformers`' auto classes (their
public `register` API), as Optimum Graphcore's package did; `optimum_ipu`'s auto classes import it. Its names are
also served at Optimum Graphcore's path, `optimum_ipu.models.groupbert` (with the `PipelinedGroupBert*` classes,
`optimum_ipu.models.class_modules`), and its pipeline stages are declared like any family's
(`optimum_ipu.models.families.encoders`). It imports nothing else of `optimum_ipu`.

A layer is four pre-norm residual blocks, in this order: convolution (LayerNorm, gated linear unit, grouped
convolution over the sequence with padding masked out, LayerNorm, Swish, projection), feed-forward, self-attention,
feed-forward; each feed-forward's down-projection is grouped (`ffn_groups`) and followed by a dense projection. The
encoder ends with a LayerNorm (pre-norm layers leave their output unnormalized).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.models.bert.modeling_bert import BertEmbeddings, BertPooler, BertPreTrainedModel


class GroupBertConfig(BertConfig):
    r"""The configuration of a [`GroupBertModel`]: a [`BertConfig`] and GroupBERT's three fields.

    Args:
        ffn_groups (`int`, *optional*, defaults to 4):
            Groups of each feed-forward module's down-projection (`intermediate_size` -> `hidden_size`).
        conv_group_size (`int`, *optional*, defaults to 16):
            Channels per group of the convolution module's grouped convolution (`hidden_size / conv_group_size`
            groups).
        conv_kernel_size (`int`, *optional*, defaults to 7):
            Kernel size of that convolution, over the sequence (odd: the output keeps the sequence length).
        kwargs: [`BertConfig`]'s fields.

    Example:

    ```python
    >>> from optimum_ipu.models.groupbert import GroupBertConfig, GroupBertForMaskedLM  # Optimum Graphcore's path
    >>> model = GroupBertForMaskedLM(GroupBertConfig(num_hidden_layers=2))
    ```
    """

    model_type = "groupbert"

    def __init__(self, ffn_groups: int = 4, conv_group_size: int = 16, conv_kernel_size: int = 7, **kwargs: Any):
        super().__init__(**kwargs)
        self.ffn_groups = ffn_groups
        self.conv_group_size = conv_group_size
        self.conv_kernel_size = conv_kernel_size
        self.check_sizes()

    def check_sizes(self) -> None:
        """GroupBERT's three sizes against the config's: checked when the config is made and again when a model is
        built (`--config_overrides` sets fields after `__init__`), before anything is allocated: a kernel of
        99,999,999 asked for terabytes, a group size of 0 divided by zero, a kernel of -3 failed inside torch.

        Raises:
            `ValueError`: one line naming the field, its value and the values it takes.
        """
        sizes = {"ffn_groups": self.ffn_groups, "conv_group_size": self.conv_group_size}
        sizes["conv_kernel_size"] = self.conv_kernel_size
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GroupBertConfig: {name} {value!r} must be a whole number >= 1 (default: 4, 16, 7)")
        h, i = self.hidden_size, self.intermediate_size
        if h % self.conv_group_size or i % self.ffn_groups or h % self.ffn_groups:
            raise ValueError(
                f"GroupBertConfig: hidden_size {self.hidden_size} must divide by conv_group_size "
                f"{self.conv_group_size}, and hidden_size and intermediate_size {self.intermediate_size} by "
                f"ffn_groups {self.ffn_groups}"
            )
        if self.conv_kernel_size % 2 == 0:
            raise ValueError(f"GroupBertConfig: conv_kernel_size {self.conv_kernel_size} must be odd (e.g. 7)")
        # a kernel wider than twice the longest sequence sees nothing more (padding="same"): only memory
        widest = 2 * self.max_position_embeddings - 1
        if self.conv_kernel_size > widest:
            raise ValueError(
                f"GroupBertConfig: conv_kernel_size {self.conv_kernel_size} is wider than any sequence of "
                f"max_position_embeddings {self.max_position_embeddings} reaches ({widest}); give an odd size up to "
                f"{widest} (GroupBERT's is 7)"
            )


class GroupBertConvolution(nn.Module):
    """The convolution module: pre-norm, a gated linear unit, a grouped convolution over the sequence (padded
    positions zeroed first, so that they do not reach their neighbours), LayerNorm, Swish, a projection, the
    residual."""

    def __init__(self, config: GroupBertConfig):
        super().__init__()
        hidden = config.hidden_size
        self.prenorm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.glu = nn.Linear(hidden, 2 * hidden)
        self.groupconv = nn.Conv1d(
            hidden, hidden, config.conv_kernel_size, padding="same", groups=hidden // config.conv_group_size
        )
        self.conv_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.output_projection = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
        gates, values = self.glu(self.prenorm(hidden_states)).chunk(2, dim=-1)  # gates first, as GroupBERT's
        gated = values * torch.sigmoid(gates)
        if token_mask is not None:
            gated = gated * token_mask
        convolved = self.groupconv(gated.transpose(1, 2)).transpose(1, 2)
        out = self.output_projection(F.silu(self.conv_norm(convolved)))
        return hidden_states + self.dropout(out)


class GroupBertIntermediate(nn.Module):
    """A feed-forward module's first half: pre-norm, the up-projection, the activation."""

    def __init__(self, config: GroupBertConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        act = config.hidden_act
        self.intermediate_act_fn = ACT2FN[act] if isinstance(act, str) else act

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(self.LayerNorm(hidden_states)))


class GroupBertOutput(nn.Module):
    """A feed-forward module's second half: the grouped down-projection (a 1-wide grouped convolution, as GroupBERT's
    checkpoints hold it), a dense projection that mixes the groups, the residual."""

    def __init__(self, config: GroupBertConfig):
        super().__init__()
        self.grouped_matmul = nn.Conv1d(config.intermediate_size, config.hidden_size, 1, groups=config.ffn_groups)
        self.dense_output_projection = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        down = self.grouped_matmul(hidden_states.transpose(1, 2)).transpose(1, 2)
        return residual + self.dropout(self.dense_output_projection(down))


class GroupBertSelfAttention(nn.Module):
    """Multi-head self-attention (query, key and value projections, scaled dot products through PyTorch's fused
    kernel)."""

    def __init__(self, config: GroupBertConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"GroupBertConfig: hidden_size {config.hidden_size} must divide by num_attention_heads "
                f"{config.num_attention_heads}"
            )
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        batch, length, hidden = hidden_states.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)

        q, k, v = heads(self.query(hidden_states)), heads(self.key(hidden_states)), heads(self.value(hidden_states))
        dropout = self.dropout_prob if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=dropout)
        return context.transpose(1, 2).reshape(batch, length, hidden)


class GroupBertSelfOutput(nn.Module):
    def __init__(self, config: GroupBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, context: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self.dropout(self.dense(context))


class GroupBertAttention(nn.Module):
    """The attention module: pre-norm, self-attention, the output projection, the residual."""

    def __init__(self, config: GroupBertConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self = GroupBertSelfAttention(config)
        self.output = GroupBertSelfOutput(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(self.LayerNorm(hidden_states), attention_mask), hidden_states)


class GroupBertLayer(GradientCheckpointingLayer):
    """One GroupBERT layer: convolution, feed-forward, attention, feed-forward (recomputed in the backward pass under
    `gradient_checkpointing_enable()`, as `transformers`' layers)."""

    def __init__(self, config: GroupBertConfig):
        super().__init__()
        self.convolution = GroupBertConvolution(config)
        self.intermediate_first = GroupBertIntermediate(config)
        self.output_first = GroupBertOutput(config)
        self.attention = GroupBertAttention(config)
        self.intermediate_second = GroupBertIntermediate(config)
        self.output_second = GroupBertOutput(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = self.convolution(hidden_states, token_mask)
        hidden_states = self.output_first(self.intermediate_first(hidden_states), hidden_states)
        hidden_states = self.attention(hidden_states, attention_mask)
        return self.output_second(self.intermediate_second(hidden_states), hidden_states)


class GroupBertEncoder(nn.Module):
    def __init__(self, config: GroupBertConfig):
        super().__init__()
        config.check_sizes()  # again: --config_overrides sets fields after the config's __init__
        self.layer = nn.ModuleList([GroupBertLayer(config) for _ in range(config.num_hidden_layers)])
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # pre-norm layers end unnormed

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, token_mask: torch.Tensor | None
    ) -> torch.Tensor:
        for layer in self.layer:
            hidden_states = layer(hidden_states, attention_mask, token_mask)
        return self.LayerNorm(hidden_states)


class GroupBertPreTrainedModel(BertPreTrainedModel):
    """BERT's pretrained-model base with GroupBERT's config and initialization: weights from a normal distribution
    truncated at two standard deviations, as GroupBERT's own code drew them."""

    config_class = GroupBertConfig
    _no_split_modules = ["BertEmbeddings", "GroupBertLayer"]
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False
    _can_record_outputs: dict = {}

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Embedding)):
            init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
            if getattr(module, "padding_idx", None) is not None:
                init.zeros_(module.weight[module.padding_idx])


class GroupBertModel(GroupBertPreTrainedModel):
    """GroupBERT's encoder: BERT's embeddings, GroupBERT's layers, BERT's pooler (optional, as in `BertModel`).

    Its `forward` takes `BertModel`'s inputs (a 2-D `attention_mask` of ones and zeros) and returns
    `last_hidden_state` and `pooler_output`; it returns no per-layer hidden states or attention weights.
    """

    def __init__(self, config: GroupBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = GroupBertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPoolingAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("GroupBertModel: give exactly one of input_ids and inputs_embeds")
        if encoder_hidden_states is not None:
            raise ValueError("GroupBertModel: an encoder only; it takes no encoder_hidden_states")
        embedded = self.embeddings(
            input_ids=input_ids, position_ids=position_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds
        )
        additive_mask = token_mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2:
                raise ValueError(f"GroupBertModel: attention_mask of shape {tuple(attention_mask.shape)}; expected 2-D")
            keep = attention_mask.to(embedded.dtype)
            token_mask = keep[:, :, None]  # (batch, sequence, 1): zeroes padded positions before the convolution
            additive_mask = (1.0 - keep[:, None, None, :]) * torch.finfo(embedded.dtype).min
        sequence_output = self.encoder(embedded, additive_mask, token_mask)
        pooled = self.pooler(sequence_output) if self.pooler is not None else None
        return BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=sequence_output, pooler_output=pooled)


class _GroupBertHead(GroupBertPreTrainedModel):
    """BERT's heads over GroupBERT's encoder: each `transformers` head class builds its BERT encoder, replaced here by
    GroupBERT's before weights are initialized or loaded, with a pooler where BERT's head has one (`_pooling`)."""

    _pooling: bool

    def __init__(self, config: GroupBertConfig):
        super().__init__(config)  # the BERT head's own __init__ (next in the method order)
        self.bert = GroupBertModel(config, add_pooling_layer=self._pooling)
        self.post_init()


def _head(bert_head: type, pooling: bool) -> type:
    """`GroupBert<Task>`: the `transformers` class `Bert<Task>`'s head over [`GroupBertModel`]."""
    name = bert_head.__name__.replace("Bert", "GroupBert", 1)
    doc = f"`{bert_head.__name__}`'s head over [`GroupBertModel`]."
    return type(name, (_GroupBertHead, bert_head), {"_pooling": pooling, "__doc__": doc, "__module__": __name__})


GroupBertForPreTraining = _head(BertForPreTraining, pooling=True)  # masked LM and next-sentence heads
GroupBertForMaskedLM = _head(BertForMaskedLM, pooling=False)
GroupBertForSequenceClassification = _head(BertForSequenceClassification, pooling=True)
GroupBertForMultipleChoice = _head(BertForMultipleChoice, pooling=True)
GroupBertForTokenClassification = _head(BertForTokenClassification, pooling=False)
GroupBertForQuestionAnswering = _head(BertForQuestionAnswering, pooling=False)


# transformers' auto class of each model class, as Optimum Graphcore's `models/groupbert/__init__.py` registered them
AUTO_CLASSES = {
    "AutoModel": GroupBertModel,
    "AutoModelForPreTraining": GroupBertForPreTraining,
    "AutoModelForMaskedLM": GroupBertForMaskedLM,
    "AutoModelForSequenceClassification": GroupBertForSequenceClassification,
    "AutoModelForMultipleChoice": GroupBertForMultipleChoice,
    "AutoModelForTokenClassification": GroupBertForTokenClassification,
    "AutoModelForQuestionAnswering": GroupBertForQuestionAnswering,
}


def register_with_transformers() -> None:
    """Register `model_type` `"groupbert"` with `AutoConfig` and each model with its auto class (again: a no-op)."""
    transformers.AutoConfig.register("groupbert", GroupBertConfig, exist_ok=True)
    for auto_name, model_class in AUTO_CLASSES.items():
        getattr(transformers, auto_name).register(GroupBertConfig, model_class, exist_ok=True)


register_with_transformers()

__all__ = [
    "GroupBertConfig",
    "GroupBertModel",
    "GroupBertForPreTraining",
    "GroupBertForMaskedLM",
    "GroupBertForSequenceClassification",
    "GroupBertForMultipleChoice",
    "GroupBertForTokenClassification",
    "GroupBertForQuestionAnswering",
]
