"""Stage plans of the decoder-only families: GPT-2, and the open decoders of today (Llama, Mistral, Qwen2).

Rotary position tables and the causal mask are computed by the base model before its first layer, so every
stage computes them for itself; grouped-query attention lives inside the layers. Only the hidden states travel.
"""

from __future__ import annotations

from ..stage_plan import StagePlan

_OPEN_DECODER_TASKS = ("ForCausalLM", "ForSequenceClassification")


def _open_decoder(family: str, prefix: str) -> StagePlan:
    return StagePlan(
        family=family,
        classes=(f"{prefix}Model", *(f"{prefix}{t}" for t in _OPEN_DECODER_TASKS)),
        embeddings=("embed_tokens", "rotary_emb"),
        layers=("layers",),
        vocabulary_loss={f"{prefix}ForCausalLM": "causal"},
    )


PLANS: tuple[StagePlan, ...] = (
    StagePlan(
        family="gpt2",
        classes=("GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification", "GPT2ForTokenClassification"),
        embeddings=("wte", "wpe"),
        layers=("h",),
        layer_count_fields=("n_layer",),
        vocabulary_loss={"GPT2LMHeadModel": "causal"},
        attention_dropout_field="attn_pdrop",
    ),
    _open_decoder("llama", "Llama"),
    _open_decoder("mistral", "Mistral"),
    _open_decoder("qwen2", "Qwen2"),
)
