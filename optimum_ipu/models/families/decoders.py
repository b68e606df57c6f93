"""Stage plans of the decoder-only families: GPT-2, and the open decoders of today (Llama, Mistral, Qwen2).

Rotary position tables and the causal mask are computed by the base model before its first layer, so every
stage computes them for itself; grouped-query attention lives inside the layers. Only the hidden states travel.
"""

from __future__ import annotations

from ..stage_plan import StagePlan

_OPEN_DECODER_TASKS = ("ForCausalLM", "ForSequenceClassification")
# Megatron's split of a Llama-like layer (torchtitan's and transformers' own `base_model_tp_plan`): query, key, value,
# gate and up column-wise, the attention output and down row-wise. Attention views its projections as (-1, head_dim),
# so each device runs its share of the heads as they are; grouped-query attention keeps its ratio of heads.
_OPEN_DECODER_TP = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def _open_decoder(family: str, prefix: str) -> StagePlan:
    return StagePlan(
        family=family,
        classes=(f"{prefix}Model", *(f"{prefix}{t}" for t in _OPEN_DECODER_TASKS)),
        embeddings=("embed_tokens", "rotary_emb"),
        layers=("layers",),
        vocabulary_loss={f"{prefix}ForCausalLM": "causal"},
        tensor_parallel=_OPEN_DECODER_TP,
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
        # one fused Conv1D projects query|key|value: each third split alike, so a device holds its heads of all
        # three; the attention splits the projection by `split_size`, divided to the share's width
        tensor_parallel={
            "attn.c_attn": "colwise_qkv",
            "attn.c_proj": "rowwise",
            "mlp.c_fc": "colwise",
            "mlp.c_proj": "rowwise",
        },
        tensor_parallel_divided=("attn.split_size",),
    ),
    _open_decoder("llama", "Llama"),
    _open_decoder("mistral", "Mistral"),
    _open_decoder("qwen2", "Qwen2"),
)
