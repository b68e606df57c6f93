"""Whether a model can take packed rows (its stage plan says), and the block-diagonal masks: a dense additive mask
for `eager`/`sdpa` attention or a `BlockMask` for `flex_attention`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from ..models.plans import plan_for_model, registered_plans

PACKING_ATTENTIONS = {"eager": "dense", "sdpa": "dense", "flex_attention": "flex"}


def check_packing_support(model: nn.Module, training: bool = True, attention: str | None = None) -> None:
    """A clear error when `model` cannot run packed rows: its stage plan must say `packing=True` (its forward
    takes `position_ids` and a ready 4-D attention mask), with the `eager` or `sdpa` attention (a dense
    mask) or `flex_attention` (a `BlockMask`). Flash attention kernels take neither: only a 2-D padding mask.

    Args:
        model (`nn.Module`): a `transformers` model (a pipelined model's `.model`).
        training (`bool`, *optional*, defaults to `True`): the model is to be trained: with `flex_attention`
            its attention dropout must be 0 (transformers' flex attention has none and refuses it in training).
        attention (`str`, *optional*): the `PackedDataCollator(attention=...)` the batches come from, checked
            against the model's (`packing_attention(model)`): a flex model given a dense mask runs it through a
            `score_mod` that reads the mask (no block skipped), which crashes PyTorch 2.13's compiled CPU kernel.
    """
    name, config = type(model).__name__, model.config
    plan = plan_for_model(model)
    if not plan.packing:
        # Decoders are left out: a 4-D mask given to them replaces their causal mask.
        families = sorted({p.family for p in registered_plans() if p.packing})
        raise ValueError(
            f"packing: {name} ({config.model_type}) is not supported; packing runs {', '.join(families)} models "
            "(encoders that take position_ids and a 4-D attention mask); train it without packing"
        )
    attn = getattr(config, "_attn_implementation", None)
    if attn is not None and attn not in PACKING_ATTENTIONS:
        raise ValueError(
            f"packing: {name} uses attn_implementation={attn!r}, which takes no 4-D attention mask (flash attention "
            "kernels take a 2-D padding mask only); load it with attn_implementation='sdpa' (or 'eager', or "
            "'flex_attention' with PackedDataCollator(attention='flex'))"
        )
    dropout_field = plan.attention_dropout_field
    dropout = getattr(config, dropout_field, 0.0) or 0.0
    if training and attn == "flex_attention" and dropout > 0:
        raise ValueError(
            f"packing: {name} uses attn_implementation='flex_attention' with {dropout_field}={dropout}; flex "
            f"attention has no attention dropout: load the model with {dropout_field}=0.0 (a config override of "
            "from_pretrained) or use attn_implementation='sdpa'"
        )
    if attention is not None and attention != packing_attention(model):
        raise ValueError(
            f"packing: PackedDataCollator(attention={attention!r}) for {name} with attn_implementation={attn!r}; "
            f"use PackedDataCollator(attention={packing_attention(model)!r}) (packing_attention(model) says which)"
        )


def packing_attention(model: nn.Module) -> str:
    """The `PackedDataCollator(attention=...)` a model takes: `"flex"` with `flex_attention`, else `"dense"`.

    Args:
        model (`nn.Module`): a `transformers` model (a pipelined model's `.model`).
    """
    return PACKING_ATTENTIONS.get(getattr(model.config, "_attn_implementation", None) or "eager", "dense")


def packed_attention_mask(sequence_ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The block-diagonal additive mask `(batch, 1, seq, seq)` of rows whose tokens carry sequence ids.

    Args:
        sequence_ids (`torch.Tensor`): `(batch, seq)`, the sequence of each token (any id; padding shares one).
        dtype (`torch.dtype`, *optional*, defaults to `torch.float32`): the mask's type; masked pairs get its
            minimum (finite, so that a softmax never sees a row of `-inf`).
    """
    same = sequence_ids[:, :, None] == sequence_ids[:, None, :]
    mask = torch.zeros(same.shape, dtype=dtype, device=sequence_ids.device)
    return mask.masked_fill_(~same, torch.finfo(dtype).min)[:, None]


PACKED_SEQUENCE_IDS = "packed_sequence_ids"


def packed_block_mask(sequence_ids: torch.Tensor) -> BlockMask:
    """The block-diagonal `BlockMask` of rows whose tokens carry sequence ids, for `flex_attention`.

    A token attends to the tokens of its own id (padding shares one id: it attends to padding, as with
    `packed_attention_mask`). The mask is made on the ids' device (its `mask_mod` reads them there: move them to
    the model's device first) with `create_block_mask`'s default blocks of 128 x 128 tokens; blocks wholly
    between two sequences are skipped by the kernels. A row whose length is no multiple of 128 is fine: the last
    block is partial (flex attention bounds its indices). It evaluates `mask_mod` on all `batch x seq x seq`
    pairs once (eagerly, outside any compiled region), which is small at fine-tuning lengths.

    Args:
        sequence_ids (`torch.Tensor`): `(batch, seq)` long, the sequence of each token (`packed_sequence_ids`).

    Returns:
        `torch.nn.attention.flex_attention.BlockMask` of shape `(batch, 1, seq, seq)`, the same for every head.
    """
    if sequence_ids.dim() != 2:
        raise ValueError(
            f"packed_block_mask: sequence_ids has shape {tuple(sequence_ids.shape)}; expected (batch, seq)"
        )
    ids = sequence_ids

    def same_sequence(
        batch: torch.Tensor, head: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return ids[batch, q_idx] == ids[batch, kv_idx]

    size, length = ids.shape
    return create_block_mask(same_sequence, B=size, H=None, Q_LEN=length, KV_LEN=length, device=ids.device)


def with_packed_block_mask(inputs: dict[str, Any]) -> dict[str, Any]:
    """A batch of `PackedDataCollator(attention="flex")`, on the model's device, ready for the model: its
    `packed_sequence_ids` replaced by `attention_mask=packed_block_mask(ids)`. `IPUTrainer` calls it on every
    batch; other batches are returned unchanged. Call it outside `torch.compile`d code (the mask is made
    eagerly; the compiled model takes the `BlockMask` as an input).

    Args:
        inputs (`dict[str, Any]`): the batch, its tensors on the model's device.
    """
    if PACKED_SEQUENCE_IDS not in inputs:
        return inputs
    inputs = dict(inputs)
    inputs["attention_mask"] = packed_block_mask(inputs.pop(PACKED_SEQUENCE_IDS))
    return inputs
