"""BERT pretraining (masked LM + next sentence prediction) with a bounded number of masked tokens, packed or not.

- `DataCollatorForLanguageModelingWithMaxTokensMasked` (Optimum Graphcore's name and behaviour): `transformers`'
  `DataCollatorForLanguageModeling` whose masking keeps at most `max_num_masked_tokens` masked tokens per row: the
  number masked is binomial, `max_num_masked_tokens` is its mean plus two standard deviations rounded up to a
  multiple of 16 (at most `max_seq_length`), and the masks drawn beyond it are dropped at random. Optimum
  Graphcore's BERT gathered that many positions before its MLM head (one static shape). Here the stock
  `BertForPreTraining` runs its head on every position and takes the mean cross-entropy over the masked ones: the
  same loss, without the gather's saving.
- `PackedPretrainingCollator`: packed rows of sentence pairs (`pack_features`, each pair's `next_sentence_label` one
  label per sequence) padded and masked block-diagonally by `PackedDataCollator`, their tokens masked as above
  over the whole row, and one `labels` tensor `(batch, seq, 2)`: `[..., 0]` the MLM labels, `[..., 1]` each
  pair's next-sentence label at its first token ([CLS]), -100 elsewhere.
- `PackedPretrainingLoss`: the `compute_loss_func` of those rows: the MLM cross-entropy over the masked tokens plus
  the NSP cross-entropy of each pair, its pooler and NSP head applied to its own [CLS] (the family's plan says how).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DataCollatorForLanguageModeling

from ..models.plans import plan_for_model, position_offset
from .binpack import IGNORE_INDEX
from .masks import check_packing_support, packing_attention

NEXT_SENTENCE_LABEL = "next_sentence_label"


def max_num_masked_tokens(max_seq_length: int, mlm_probability: float) -> int:
    """Optimum Graphcore's bound on the masked tokens of a row: mean + 2 std of the binomial count, rounded up to a
    multiple of 16, at most `max_seq_length` (128 tokens at 15 %: 32; 512 at 15 %: 96)."""
    mean = max_seq_length * mlm_probability
    std = math.sqrt(max_seq_length * mlm_probability * (1 - mlm_probability))
    return min(math.ceil((mean + 2 * std) / 16) * 16, max_seq_length)


class DataCollatorForLanguageModelingWithMaxTokensMasked(DataCollatorForLanguageModeling):
    """`DataCollatorForLanguageModeling` that masks at most `max_num_masked_tokens` tokens of each row (Optimum
    Graphcore's collator, same name and arguments).

    Tokens are drawn with `mlm_probability` (never special tokens nor padding), the draws of a row beyond
    `max_num_masked_tokens` are dropped at random, and the kept ones are replaced 80 % by `[MASK]`, 10 % by a random
    token and 10 % left as they are (`mask_replace_prob`, `random_replace_prob`). Batches are plain dicts; other
    columns (`next_sentence_label`, `token_type_ids`) pass through.

    Args:
        max_seq_length (`int`): the tokens of a row the bound is computed for (rows are padded to it or shorter).
        *args, **kwargs: `DataCollatorForLanguageModeling`'s (`tokenizer`, `mlm_probability`, ...).

    Example:

    ```python
    >>> from optimum_ipu.data import DataCollatorForLanguageModelingWithMaxTokensMasked
    >>> collator = DataCollatorForLanguageModelingWithMaxTokensMasked(128, tokenizer=tokenizer)  # doctest: +SKIP
    >>> collator.max_num_masked_tokens  # doctest: +SKIP
    32
    ```
    """

    def __init__(self, max_seq_length: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if max_seq_length < 1:
            raise ValueError(f"max_seq_length: got {max_seq_length}; expected a positive number of tokens")
        self.max_seq_length = max_seq_length
        self.max_num_masked_tokens = max_num_masked_tokens(max_seq_length, self.mlm_probability)

    def torch_call(self, examples: list[Any]) -> dict[str, Any]:
        return dict(super().torch_call(examples))  # a dict, not a BatchEncoding (as Optimum Graphcore's)

    def torch_mask_tokens(
        self, inputs: torch.Tensor, special_tokens_mask: torch.Tensor | None = None, offset_mapping: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask `inputs` in place (80 % `[MASK]`, 10 % random, 10 % kept) and return `(inputs, labels)`, labels -100
        where not masked; at most `max_num_masked_tokens` masked tokens per row."""
        labels = inputs.clone()
        if special_tokens_mask is None:
            special = torch.isin(inputs, torch.as_tensor(self.tokenizer.all_special_ids, device=inputs.device))
        else:
            special = special_tokens_mask.bool()
        probability = torch.full(labels.shape, self.mlm_probability).masked_fill_(special, 0.0)
        masked = torch.bernoulli(probability, generator=self.generator).bool()
        masked = keep_at_most(masked, self.max_num_masked_tokens, self.generator)
        labels[~masked] = IGNORE_INDEX
        # `mask_replace_prob` (0.8) of them [MASK], `random_replace_prob` (0.1) a random token, the rest kept
        replace, random = self.mask_replace_prob, self.random_replace_prob
        replaced = torch.bernoulli(torch.full(labels.shape, replace), generator=self.generator).bool() & masked
        inputs[replaced] = self.tokenizer.convert_tokens_to_ids(self.tokenizer.mask_token)
        share = random / (1 - replace) if replace < 1 else 0.0
        randomised = torch.bernoulli(torch.full(labels.shape, share), generator=self.generator).bool()
        randomised &= masked & ~replaced
        words = torch.randint(len(self.tokenizer), labels.shape, dtype=torch.long, generator=self.generator)
        inputs[randomised] = words[randomised]
        return inputs, labels


def keep_at_most(masked: torch.Tensor, limit: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """`masked` `(rows, seq)` bool with at most `limit` `True` per row: the extra ones, chosen at random, cleared."""
    if limit >= masked.shape[-1]:
        return masked
    # the masked first in a random order, then the rest: a row keeps the first `limit` of that order
    keys = masked.float() + torch.rand(masked.shape, generator=generator) * 0.5
    kept = torch.zeros_like(masked)
    kept.scatter_(1, torch.topk(keys, k=limit, dim=1).indices, True)
    return masked & kept


class PackedPretrainingCollator:
    """Packed rows of sentence pairs to a BERT pretraining batch (see the module's docstring).

    Rows come from `pack_features` on pairs with a `labels` column holding each pair's `next_sentence_label`
    (`pack_pretraining_pairs` does it); a row without `position_ids` is one unpacked pair (evaluation), laid out
    the same way.

    Args:
        tokenizer: the tokenizer (`[MASK]`, special and padding ids, vocabulary size).
        max_seq_length (`int`): tokens of a row.
        max_sequences_per_row (`int`): NSP slots of a row (at least the most pairs a packed row holds).
        mlm_probability (`float`, *optional*, defaults to 0.15): share of the tokens masked.
        position_offset (`int`, *optional*, defaults to 0): added to every position id.
        mask_dtype (`torch.dtype`, *optional*, defaults to `torch.float32`): the additive mask's type.
        attention (`str`, *optional*, defaults to `"dense"`): `"dense"` or `"flex"` (see `PackedDataCollator`).
    """

    def __init__(
        self,
        tokenizer: Any,
        max_seq_length: int,
        max_sequences_per_row: int,
        mlm_probability: float = 0.15,
        position_offset: int = 0,
        mask_dtype: torch.dtype = torch.float32,
        attention: str = "dense",
    ) -> None:
        from .collator import PackedDataCollator

        self.rows = PackedDataCollator(
            max_seq_length, max_sequences_per_row, tokenizer.pad_token_id, position_offset, mask_dtype, attention
        )
        self.masking = DataCollatorForLanguageModelingWithMaxTokensMasked(
            max_seq_length, tokenizer=tokenizer, mlm_probability=mlm_probability
        )
        self.position_offset = position_offset

    def __call__(self, rows: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        rows = [row if "position_ids" in row else _as_packed_row(row) for row in rows]
        batch = self.rows(rows)
        slots = batch.pop("labels")  # (batch, slots, 3): [start, end, next_sentence_label]
        batch["input_ids"], mlm = self.masking.torch_mask_tokens(batch["input_ids"])
        nsp = torch.full_like(mlm, IGNORE_INDEX)
        rows_at, slots_at = (slots[..., 0] != IGNORE_INDEX).nonzero(as_tuple=True)
        nsp[rows_at, slots[rows_at, slots_at, 0]] = slots[rows_at, slots_at, 2]
        batch["labels"] = torch.stack([mlm, nsp], dim=-1)
        batch["output_hidden_states"] = True  # the loss applies the NSP head to each pair's [CLS]
        return batch


def _as_packed_row(pair: Mapping[str, Any]) -> dict[str, Any]:
    n = len(pair["input_ids"])
    row = {"input_ids": pair["input_ids"], "position_ids": list(range(n)), "labels": [pair[NEXT_SENTENCE_LABEL]]}
    if "token_type_ids" in pair:
        row["token_type_ids"] = pair["token_type_ids"]
    return row


def _check_next_sentence_head(model: nn.Module) -> Any:
    plan = plan_for_model(model)
    if plan.sequence_head is None or not hasattr(getattr(model, "cls", None), "seq_relationship"):
        raise ValueError(
            f"packed pretraining: {type(model).__name__} has no next-sentence head the plan of its family can apply; "
            "use BertForPreTraining, or train without --packing"
        )
    return plan


def next_sentence_logits(model: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """The NSP logits `(batch, seq, 2)` of every position taken as a pair's first token: the model's pooler and NSP
    head applied to each position alone (as the model applies them to position 0), from its family's plan."""
    plan = _check_next_sentence_head(model)
    batch, seq, hidden = hidden_states.shape
    return plan.sequence_head(model, hidden_states.reshape(batch * seq, 1, hidden)).reshape(batch, seq, -1)


class PackedPretrainingLoss:
    """MLM + NSP loss of `PackedPretrainingCollator` batches (a `Trainer` `compute_loss_func`): the mean
    cross-entropy over the masked tokens plus the mean NSP cross-entropy over the pairs, as `BertForPreTraining`'s
    own loss over unpacked rows.

    Args:
        model (`nn.Module`): the stock `BertForPreTraining` (a pipelined model's `.model`).
    """

    def __init__(self, model: nn.Module) -> None:
        check_packing_support(model)
        _check_next_sentence_head(model)
        self.model = model

    def __call__(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        hidden = getattr(outputs, "hidden_states", None)
        if hidden is None:
            raise ValueError("packed pretraining needs the model's hidden states: call it with output_hidden_states")
        logits = outputs["prediction_logits"].float()
        mlm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[..., 0].reshape(-1))
        nsp_logits = next_sentence_logits(self.model, hidden[-1]).float()
        nsp = F.cross_entropy(nsp_logits.reshape(-1, nsp_logits.shape[-1]), labels[..., 1].reshape(-1))
        return mlm + nsp


def pack_pretraining_pairs(pairs: Any, max_seq_length: int, max_sequences_per_pack: int | None = None) -> dict:
    """`pack_features` of sentence pairs (`input_ids`, `token_type_ids`, `next_sentence_label`): the packed rows,
    each pair's next-sentence label in the row's `labels`."""
    from .binpack import pack_features

    columns = {name: pairs[name] for name in ("input_ids", "token_type_ids")}
    columns["labels"] = pairs[NEXT_SENTENCE_LABEL]
    return pack_features(columns, max_seq_length, max_sequences_per_pack)


def packed_pretraining_collator(
    model: nn.Module, tokenizer: Any, max_seq_length: int, max_sequences_per_row: int, mlm_probability: float
) -> PackedPretrainingCollator:
    """The `PackedPretrainingCollator` of a model: its attention kind (dense mask or flex), position offset and
    mask type; a clear error for a family whose attention takes no block-diagonal mask."""
    check_packing_support(model)
    return PackedPretrainingCollator(
        tokenizer,
        max_seq_length,
        max_sequences_per_row,
        mlm_probability,
        position_offset=position_offset(model.config),
        mask_dtype=model.dtype,
        attention=packing_attention(model),
    )


def pad_on_batch_axis(batch_size: int) -> Callable[[Callable], Callable]:
    """Optimum Graphcore's decorator of a data collator: every tensor of a smaller batch is filled up to
    `batch_size` rows by repeating its rows (static batch shapes). `IPUTrainingArguments(pad_on_batch_axis=True)`
    does this for evaluation here; training batches are always full (the last incomplete one is dropped)."""

    def pad(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.size(0) == batch_size:
            return x
        repeats = [batch_size // x.size(0) + 1] + [1] * (x.dim() - 1)
        return x.repeat(*repeats)[:batch_size]

    def decorator(data_collator: Callable) -> Callable:
        @wraps(data_collator)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            batch = data_collator(*args, **kwargs)
            return {k: pad(v) for k, v in batch.items()}

        return wrapper

    return decorator
