"""Stage plans of the encoder-decoder text families: T5 (and T5EncoderModel), MT5 and BART.

The encoder's layers then the decoder's are counted together in `layers_per_ipu`. When the stages run apart,
the encoder's output (after its final norm) travels with every decoder stage, which gives it to the stock
forward as `encoder_outputs`.

T5's first block of each stack computes the relative position bias that every later block of the stack reuses
(the others hold no bias table). A stage that does not run that block stands it in with `T5BlockStandIn`,
which computes the bias from the same table (and every T5 block of another stage is stood in so
that the biases pass through it): the table's gradient then comes from every stage, and the runtime
sums it, as it does for tied embeddings.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..stage_plan import StagePlan


class T5BlockStandIn(nn.Module):
    """Stands in for a T5 block of another stage: passes the hidden states and the position biases it is given
    on (the stack reads them back from each block's output) and, for a stack's first block, computes the
    position bias that the block would have returned, from the same table."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        # a plain reference, not a submodule: the attention stays registered in its own block only
        object.__setattr__(self, "attention", block.layer[0].SelfAttention)

    def borrowed_parameters(self) -> list[nn.Parameter]:
        """The block's parameters this stand-in runs (the position bias table): a stage that stands the block in
        holds them too (`optimum_ipu.runtime.stages.hold`)."""
        if not self.attention.has_relative_attention_bias:
            return []
        return list(self.attention.relative_attention_bias.parameters())

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Any = None,
        position_bias: Any = None,
        encoder_hidden_states: Any = None,
        encoder_attention_mask: Any = None,
        encoder_decoder_position_bias: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any, Any]:
        if position_bias is None and self.attention.has_relative_attention_bias:
            length = hidden_states.shape[1]  # training and evaluation without a cache: keys = queries
            position_bias = self.attention.compute_bias(length, length, device=hidden_states.device)
        return hidden_states, position_bias, encoder_decoder_position_bias


_T5_CLASSES = (
    "ForConditionalGeneration",
    "Model",
    "EncoderModel",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
)


# T5's block: attention's q, k, v (self and cross) and the feed-forward's wi (wi_0, wi_1 gated) column-wise, o and wo
# row-wise; the first block's relative position bias (one feature a head) split by its features, and `n_heads`
# divided where a block builds a zero bias of its own (the decoder's cross attention). `*`: the block's sub-layer.
_T5_TP = {
    **{f"layer.*.{attn}.{name}": "colwise" for attn in ("SelfAttention", "EncDecAttention") for name in "qkv"},
    "layer.*.SelfAttention.o": "rowwise",
    "layer.*.EncDecAttention.o": "rowwise",
    "layer.*.SelfAttention.relative_attention_bias": "colwise",
    "layer.*.DenseReluDense.wi": "colwise",
    "layer.*.DenseReluDense.wi_0": "colwise",
    "layer.*.DenseReluDense.wi_1": "colwise",
    "layer.*.DenseReluDense.wo": "rowwise",
}


def _t5_plan(prefix: str) -> StagePlan:
    """The plan of T5 (`prefix="T5"`) or of MT5 (`"MT5"`): MT5's modeling code is T5's under its own names."""
    return StagePlan(
        family=prefix.lower(),
        classes=tuple(f"{prefix}{suffix}" for suffix in _T5_CLASSES),
        embeddings=("shared",),
        layers=("encoder.block", "decoder.block?"),
        layer_count_fields=("num_layers", "num_decoder_layers"),
        encoder="encoder",
        vocabulary_loss={f"{prefix}ForConditionalGeneration": "masked"},
        attention_dropout_field="dropout_rate",
        layer_stand_in=T5BlockStandIn,
        tensor_parallel=_T5_TP,
        tensor_parallel_divided=("layer.*.SelfAttention.n_heads", "layer.*.EncDecAttention.n_heads"),
    )


PLANS: tuple[StagePlan, ...] = (
    _t5_plan("T5"),
    _t5_plan("MT5"),
    StagePlan(
        family="bart",
        classes=(
            "BartModel",
            "BartForConditionalGeneration",
            "BartForSequenceClassification",
            "BartForQuestionAnswering",
        ),
        # what runs before each stack's first layer (the decoder's on the stage where it starts)
        embeddings=(
            "shared",
            "encoder.embed_positions",
            "encoder.layernorm_embedding",
            "decoder.embed_positions",
            "decoder.layernorm_embedding",
        ),
        layers=("encoder.layers", "decoder.layers"),
        layer_count_fields=("encoder_layers", "decoder_layers"),
        encoder="encoder",
        # no chunked vocabulary loss: BART adds `final_logits_bias` to the projection's output, which the
        # chunked loss would skip; the serialized projection still computes the logits in chunks
    ),
)
