"""`PackedDataCollator`: packed rows padded to `max_seq_length`, with their masks and per-sequence label slots."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..models.plans import position_offset
from .binpack import IGNORE_INDEX, QA_COLUMNS, pack_features
from .masks import PACKED_SEQUENCE_IDS, check_packing_support, packed_attention_mask, packing_attention

logger = logging.getLogger(__name__)


class PackedDataCollator:
    """Pads packed rows (from `pack_features`) to `max_seq_length` and builds the model inputs and packed labels.

    Args:
        max_seq_length (`int`): tokens of every row (static shapes).
        max_sequences_per_row (`int`): label slots per row (static shapes); a row holding more sequences is an
            error. `max(map(len, packed["feature_index"]))` is the least that fits a packed set.
        pad_token_id (`int`, *optional*, defaults to 0): the tokenizer's padding id.
        position_offset (`int`, *optional*, defaults to 0): added to every position id: RoBERTa numbers
            positions from `pad_token_id + 1` (`position_offset(model.config)` says what a model needs).
        mask_dtype (`torch.dtype`, *optional*, defaults to `torch.float32`): the attention mask's type: the
            model's weights' type (float32 also under autocast; `torch.bfloat16` for a model loaded in bf16, whose
            `eager` attention adds the mask to bf16 scores). Unused with `attention="flex"`.
        attention (`str`, *optional*, defaults to `"dense"`): how attention is kept inside each sequence:
            `"dense"`, a 4-D additive `attention_mask` (models with `eager` or `sdpa` attention), or `"flex"`,
            `packed_sequence_ids` from which `IPUTrainer` makes a `BlockMask` on the device (models with
            `flex_attention`). `packing_attention(model)` says which a model takes.

    Returns (when called on a list of packed rows): `input_ids`, `token_type_ids`, `position_ids`, the 4-D
    `attention_mask` (`"dense"`) or `packed_sequence_ids` `(batch, seq)` long, 0 for padding and 1, 2, ... for
    the row's sequences (`"flex"`), and, when the rows have labels, `labels` of shape `(batch,
    max_sequences_per_row, 4)` (`[start, end, start_position, end_position]`, QA) or `(batch,
    max_sequences_per_row, 3)` (`[start, end, label]`, classification; float for regression labels) or `(batch,
    max_sequences_per_row, 2 + num_labels)` (`[start, end, y_1, ..., y_k]`, float: multi-label classification, each
    feature's `labels` a multi-hot vector), -100 in empty slots.
    """

    def __init__(
        self,
        max_seq_length: int,
        max_sequences_per_row: int,
        pad_token_id: int = 0,
        position_offset: int = 0,
        mask_dtype: torch.dtype = torch.float32,
        attention: str = "dense",
    ) -> None:
        if attention not in ("dense", "flex"):
            raise ValueError(
                f"attention: got {attention!r}; expected 'dense' (eager or sdpa attention) or 'flex' "
                "(flex_attention); packing_attention(model) says which a model takes"
            )
        if max_sequences_per_row < 1:
            raise ValueError(f"max_sequences_per_row: got {max_sequences_per_row}; expected a positive number")
        if not mask_dtype.is_floating_point:
            raise ValueError(f"mask_dtype: got {mask_dtype}; the mask is additive: pass the model's float type")
        self.max_seq_length, self.max_sequences_per_row = max_seq_length, max_sequences_per_row
        self.pad_token_id, self.position_offset, self.mask_dtype = pad_token_id, position_offset, mask_dtype
        self.attention = attention

    def __call__(self, rows: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        size, length, slots = len(rows), self.max_seq_length, self.max_sequences_per_row
        input_ids = torch.full((size, length), self.pad_token_id, dtype=torch.long)
        token_type_ids = torch.zeros((size, length), dtype=torch.long)
        position_ids = torch.zeros((size, length), dtype=torch.long)
        sequence_ids = torch.zeros((size, length), dtype=torch.long)  # 0: padding, 1..k: the row's sequences
        qa = "start_positions" in rows[0]
        has_labels = qa or "labels" in rows[0]
        columns, floats = label_layout(rows) if has_labels and not qa else (4, False)
        labels = torch.full((size, slots, columns), IGNORE_INDEX, dtype=torch.float if floats else torch.long)
        for r, row in enumerate(rows):
            n = len(row["input_ids"])
            if n > length:
                raise ValueError(f"a packed row has {n} tokens, more than max_seq_length={length}")
            positions = torch.as_tensor(row["position_ids"], dtype=torch.long)
            starts = (positions == 0).nonzero().flatten().tolist()
            if len(starts) > slots:
                raise ValueError(
                    f"a packed row holds {len(starts)} sequences, more than max_sequences_per_row={slots}; pack "
                    f"with max_sequences_per_row={slots} or raise it here"
                )
            input_ids[r, :n] = torch.as_tensor(row["input_ids"])
            if "token_type_ids" in row:
                token_type_ids[r, :n] = torch.as_tensor(row["token_type_ids"])
            position_ids[r, :n] = positions
            spans = list(zip(starts, [*starts[1:], n], strict=True))
            for j, (start, end) in enumerate(spans):
                sequence_ids[r, start:end] = j + 1
            if not has_labels:
                continue
            for j, (start, end) in enumerate(spans):
                values = [row[name][j] for name in QA_COLUMNS] if qa else _flat(row["labels"][j])
                if any(v is None or v == IGNORE_INDEX for v in values):
                    continue  # an unlabelled sequence: the whole slot stays -100, so counts stay exact
                labels[r, j] = torch.as_tensor([start, end, *values], dtype=labels.dtype)
        batch = {"input_ids": input_ids, "position_ids": position_ids + self.position_offset}
        # `Trainer` drops the columns its model's forward does not name (DistilBERT has no token_type_ids)
        if "token_type_ids" in rows[0]:
            batch["token_type_ids"] = token_type_ids
        if self.attention == "flex":
            batch[PACKED_SEQUENCE_IDS] = sequence_ids  # the BlockMask is made from it on the device
        else:
            batch["attention_mask"] = packed_attention_mask(sequence_ids, self.mask_dtype)
        if has_labels:
            batch["labels"] = labels
        return batch


def _flat(label: Any) -> list:
    """One sequence's label as slot values: a class id or a value, or the multi-hot vector of a multi-label one."""
    return list(label) if isinstance(label, (list, tuple)) else [label]


def label_layout(rows: list[Mapping[str, Any]]) -> tuple[int, bool]:
    """`(columns, floats)` of the classification label slots of `rows`: `[start, end, label]` (a class id, long;
    a regression value, float) or `[start, end, y_1, ..., y_k]` (multi-label: a multi-hot vector of k classes, float,
    `problem_type="multi_label_classification"`)."""
    values = [label for row in rows for label in row["labels"] if label is not None]
    vectors = [v for v in values if isinstance(v, (list, tuple))]
    if not vectors:
        return 3, any(isinstance(v, float) for v in values)
    widths = {len(v) for v in vectors}
    if len(vectors) != len(values) or len(widths) != 1:
        raise ValueError(
            f"packed labels: multi-label rows need one vector of the same length a sequence; got lengths "
            f"{sorted(widths)} and {len(values) - len(vectors)} scalar label(s)"
        )
    return 2 + widths.pop(), True


@dataclass
class PackedTraining:
    """What `prepare_packed_training` returns: the packed rows, their collator and the packed loss.

    Args:
        train_dataset (`datasets.Dataset`): one packed row per item (`pack_features`' columns).
        data_collator (`Callable`): packs training rows with `PackedDataCollator` and hands unpacked batches
            (evaluation, prediction: no `position_ids`) to the collator it was given.
        compute_loss_func (`Callable`): the per-sequence loss, for `IPUTrainer(compute_loss_func=...)`.
        features (`int`): the training features before packing (for `train_features_per_second`).
    """

    train_dataset: Any
    data_collator: Callable[[list[dict]], dict]
    compute_loss_func: Callable[..., torch.Tensor]
    features: int


def collator_for(model: nn.Module, max_seq_length: int, max_sequences_per_row: int, pad_token_id: int):
    """The `PackedDataCollator` of `model`: its position offset, its weights' type for the mask, and the attention
    kind it takes (a dense mask for eager and sdpa, a `BlockMask` for flex_attention)."""
    return PackedDataCollator(
        max_seq_length,
        max_sequences_per_row,
        pad_token_id=pad_token_id,
        position_offset=position_offset(model.config),
        mask_dtype=model.dtype,
        attention=packing_attention(model),
    )


def prepare_packed_training(
    model: nn.Module,
    train_dataset: Any,
    max_seq_length: int,
    pad_token_id: int,
    unpacked_collator: Callable[[list[dict]], dict],
    compute_loss_func: Callable[..., torch.Tensor],
    max_sequences_per_pack: int | None = None,
    output_hidden_states: bool = False,
) -> PackedTraining:
    """Everything a script needs to train on packed rows, in one call: the support check, the packing, the
    collator of the model's attention kind (dense mask or flex `BlockMask`) with its position offset and mask type.

    Set the trainer's `label_names` to `["labels"]`: the packed labels are one tensor of per-sequence slots, read by
    the packed loss (the model itself gets no labels).

    Args:
        model (`nn.Module`): the stock model (a pipelined model's `.model`).
        train_dataset (`datasets.Dataset`): training features tokenized without padding.
        max_seq_length (`int`): the row length.
        pad_token_id (`int`): the tokenizer's padding id.
        unpacked_collator (`Callable`): the collator of unpacked batches (evaluation and prediction).
        compute_loss_func (`Callable`): the packed loss (`packed_question_answering_loss`,
            `PackedSequenceClassificationLoss(model)`).
        max_sequences_per_pack (`int`, *optional*): at most this many features a row.
        output_hidden_states (`bool`, *optional*, defaults to `False`): packed batches ask the model for its
            hidden states (the packed classification loss applies the head to each sequence's first token).
    """
    import datasets  # the scripts' dependency; the library itself packs lists

    check_packing_support(model)  # a clear error for families whose attention takes no block-diagonal mask
    packed = pack_features(train_dataset, max_seq_length, max_sequences_per_pack)
    rows = datasets.Dataset.from_dict(packed)
    features = len(train_dataset)
    logger.info(
        "packing: %d training features in %d rows of %d tokens (%.2f a row)",
        features,
        len(rows),
        max_seq_length,
        features / len(rows),
    )
    pack_collator = collator_for(model, max_seq_length, max(map(len, packed["feature_index"])), pad_token_id)
    extra = {"output_hidden_states": True} if output_hidden_states else {}

    def collate(batch: list[dict]) -> dict:
        if "position_ids" not in batch[0]:  # evaluation and prediction features are not packed
            return unpacked_collator(batch)
        return {**pack_collator(batch), **extra}

    return PackedTraining(rows, collate, compute_loss_func, features)
