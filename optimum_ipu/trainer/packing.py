"""Sequence packing: several short tokenized features share one row of `max_seq_length` tokens.

SQuAD or GLUE features tokenized without padding are mostly far shorter than `max_seq_length`; padding each to a
full row spends most of the compute on padding. Packing puts several features in one row, keeping the static
shapes every graph here needs, with the numbers of running each feature alone:

- `pack_features` chooses the rows (best-fit decreasing bin packing) and concatenates each row's features:
  `input_ids`, `token_type_ids`, `position_ids` restarted at 0 for every sequence, and the labels moved to
  the row: QA `start_positions` / `end_positions` shifted by the sequence's offset in the row, classification
  `labels` one per sequence. It also records `feature_index` and `sequence_lengths` per row, for `unpack_logits`.
- `PackedDataCollator` pads rows to `max_seq_length` and masks attention block-diagonally: a token attends to
  the tokens of its own sequence only (padding to padding, so that no row of the mask is empty).
  `transformers`' BERT-family models take a ready 4-D mask as it is (`masking_utils` returns it unchanged):
  - `attention="dense"` (default; the `eager` and `sdpa` implementations): an additive 4-D `attention_mask`
    `(batch, 1, seq, seq)`, 0 or the minimum of its float type (the model's: float32 by default), which both
    accept (`eager` adds it to the scores; `sdpa` takes a float mask).
  - `attention="flex"` (`flex_attention`): no mask but `packed_sequence_ids` `(batch, seq)`, each token's
    sequence in its row (0 for padding). A `BlockMask` closes over tensors of the model's device, so it is made
    there at step time: `IPUTrainer` replaces the ids by `packed_block_mask(ids)` when it moves a batch to the
    device (`with_packed_block_mask` does the same for a hand-written loop). Flex attention skips the blocks of
    128 x 128 tokens that lie wholly between two sequences, and no `seq x seq` mask travels from the host.
    Its backward runs on CUDA (and other accelerators), not on CPU: PyTorch 2.13 has no flex attention backward
    there, eager or compiled, so flex packing trains on a GPU; on a CPU it evaluates only (forward).
  Flash attention kernels take no 4-D mask or `BlockMask`: not supported (`check_packing_support` says so).
  `PackedDataCollator(attention=packing_attention(model))` picks the kind a model takes.
- The labels of a packed batch are one tensor `labels` of shape `(batch, max_sequences_per_row, columns)`, one
  slot per sequence: `[start, end, start_position, end_position]` (QA) or `[start, end, label]` (classification),
  `start:end` being the sequence's tokens in the row; empty slots, and sequences without a label, are all -100.
  `packed_question_answering_loss` and `PackedSequenceClassificationLoss` read it; both have the signature of
  `transformers.Trainer`'s `compute_loss_func`, so the stock model's forward runs unchanged (no labels reach it).

Per-sequence losses equal those of each feature run alone at its own length: a QA sequence's cross-entropy is
taken over its own tokens (the logits of the other sequences and of padding are masked out), a classification
sequence's logits come from the model's own head applied to the hidden state of its first token ([CLS]).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from transformers.loss.loss_utils import ForSequenceClassificationLoss

from ..models.plans import plan_for_model, position_offset, registered_plans

IGNORE_INDEX = -100
QA_COLUMNS = ("start_positions", "end_positions")


def pack_sequences(
    lengths: Sequence[int], max_seq_length: int, max_sequences_per_row: int | None = None
) -> list[list[int]]:
    """Choose rows for sequences of the given lengths: best-fit decreasing bin packing.

    Sequences are placed longest first, each in the open row with the least room that still holds it (a new row
    when none does, or when every such row already holds `max_sequences_per_row` sequences). Best fit with
    decreasing sizes uses at most 11/9 of the optimal number of rows plus one, like first-fit decreasing, and
    runs in `O(n log max_seq_length)` here (rows are kept in buckets by the room they have left).

    Args:
        lengths (`Sequence[int]`): tokens of each sequence, each from 1 to `max_seq_length`.
        max_seq_length (`int`): tokens of a row.
        max_sequences_per_row (`int`, *optional*): at most this many sequences in a row (no limit by default).

    Returns:
        `list[list[int]]`: for each row, the indices (into `lengths`) of its sequences, in the order they are
        laid out in the row (ascending index); rows in the order they were opened.
    """
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length: got {max_seq_length}; expected a positive number of tokens")
    if max_sequences_per_row is not None and max_sequences_per_row < 1:
        raise ValueError(f"max_sequences_per_row: got {max_sequences_per_row}; expected a positive number or None")
    for index, length in enumerate(lengths):
        if not 1 <= length <= max_seq_length:
            raise ValueError(
                f"feature {index} has {length} tokens; packing takes features of 1 to max_seq_length="
                f"{max_seq_length} tokens (tokenize with truncation to max_seq_length and without padding)"
            )
    rows: list[list[int]] = []
    by_room: dict[int, list[int]] = {}  # room left -> rows with that much room (that can take more sequences)
    rooms: list[int] = []  # sorted keys of by_room
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        at = bisect.bisect_left(rooms, length)
        if at < len(rooms):
            room = rooms[at]
            row = by_room[room].pop()
            if not by_room[room]:
                del by_room[room]
                rooms.pop(at)
        else:
            room, row = max_seq_length, len(rows)
            rows.append([])
        rows[row].append(index)
        left = room - length
        if left > 0 and (max_sequences_per_row is None or len(rows[row]) < max_sequences_per_row):
            if left not in by_room:
                by_room[left] = []
                bisect.insort(rooms, left)
            by_room[left].append(row)
    return [sorted(row) for row in rows]


def _column(features: Any, name: str) -> list | None:
    names = getattr(features, "column_names", None) or list(features.keys())
    return list(features[name]) if name in names else None


def pack_features(
    features: Mapping[str, Sequence] | Any, max_seq_length: int, max_sequences_per_row: int | None = None
) -> dict[str, list]:
    """Pack tokenized features (tokenized without padding) into rows of at most `max_seq_length` tokens.

    Args:
        features (`Mapping[str, Sequence]` or `datasets.Dataset`): columns `input_ids` and optionally
            `token_type_ids`, `attention_mask` (all ones: padding is not allowed), `start_positions` and
            `end_positions` (QA, token indices in the feature) or `labels` / `label` (one per feature). Other
            columns (`offset_mapping`, `example_id`, ...) are left out: post-processing reads them from the
            unpacked features, which `feature_index` points back to.
        max_seq_length (`int`): tokens of a row.
        max_sequences_per_row (`int`, *optional*): at most this many features in a row.

    Returns:
        `dict[str, list]`: one entry per row: `input_ids`, `token_type_ids`, `position_ids` (restarting at 0 for
        each feature), `feature_index` and `sequence_lengths` (lists over the row's features), and the labels
        present: `start_positions` / `end_positions` shifted by each feature's offset in the row, or `labels`.
        `datasets.Dataset.from_dict` turns it into a dataset for `PackedDataCollator`.

    Example:

    ```python
    >>> packed = pack_features({"input_ids": [[101, 7, 102], [101, 8, 9, 102], [101, 102]]}, max_seq_length=6)
    >>> packed["feature_index"], packed["position_ids"]
    ([[1, 2], [0]], [[0, 1, 2, 3, 0, 1], [0, 1, 2]])
    ```
    """
    input_ids = _column(features, "input_ids")
    if input_ids is None:
        raise ValueError("pack_features: the features have no 'input_ids' column")
    token_type_ids = _column(features, "token_type_ids")
    attention_mask = _column(features, "attention_mask")
    if attention_mask is not None:
        for index, mask in enumerate(attention_mask):
            if not all(mask):
                raise ValueError(
                    f"feature {index} is padded (its attention_mask has zeros); tokenize without padding "
                    "(padding=False, e.g. --pad_to_max_length false) before packing"
                )
    qa = {name: _column(features, name) for name in QA_COLUMNS}
    if (qa["start_positions"] is None) != (qa["end_positions"] is None):
        raise ValueError("pack_features: 'start_positions' and 'end_positions' come together; one is missing")
    labels = _column(features, "labels")
    if labels is None:
        labels = _column(features, "label")
    lengths = [len(ids) for ids in input_ids]
    if qa["start_positions"] is not None:
        for index, length in enumerate(lengths):
            for name in QA_COLUMNS:
                if not 0 <= qa[name][index] < length:
                    raise ValueError(
                        f"feature {index}: {name}={qa[name][index]} is outside its {length} tokens; a packed "
                        "answer must lie in its own feature (label impossible answers with the [CLS] index)"
                    )
    rows = pack_sequences(lengths, max_seq_length, max_sequences_per_row)
    packed: dict[str, list] = {
        k: [] for k in ("input_ids", "token_type_ids", "position_ids", "feature_index", "sequence_lengths")
    }
    if qa["start_positions"] is not None:
        packed.update({name: [] for name in QA_COLUMNS})
    if labels is not None:
        packed["labels"] = []
    for row in rows:
        offsets = np.cumsum([0] + [lengths[i] for i in row[:-1]]).tolist()
        packed["input_ids"].append([t for i in row for t in input_ids[i]])
        packed["token_type_ids"].append(
            [t for i in row for t in (token_type_ids[i] if token_type_ids else [0] * lengths[i])]
        )
        packed["position_ids"].append([p for i in row for p in range(lengths[i])])
        packed["feature_index"].append(list(row))
        packed["sequence_lengths"].append([lengths[i] for i in row])
        if qa["start_positions"] is not None:
            for name in QA_COLUMNS:
                packed[name].append([qa[name][i] + offset for i, offset in zip(row, offsets, strict=True)])
        if labels is not None:
            packed["labels"].append([labels[i] for i in row])
    return packed


# attn_implementation -> the PackedDataCollator(attention=...) it takes
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
    max_sequences_per_row, 3)` (`[start, end, label]`, classification; float for regression labels), -100 in
    empty slots.
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
        regression = has_labels and not qa and any(isinstance(v, float) for r in rows for v in r["labels"])
        labels = torch.full(
            (size, slots, 4 if qa else 3), IGNORE_INDEX, dtype=torch.float if regression else torch.long
        )
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
                values = [row[name][j] for name in QA_COLUMNS] if qa else [row["labels"][j]]
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


def _present(labels: torch.Tensor) -> torch.Tensor:
    return labels[..., 0] != IGNORE_INDEX


def _sequence_count(labels: torch.Tensor, num_items_in_batch: Any) -> torch.Tensor | int:
    """The sequences a loss is averaged over: this batch's labelled ones, or, as `Trainer` counts items over the
    accumulated batches (non -100 entries of `labels`), that count over the entries of a slot."""
    if num_items_in_batch is None:
        return _present(labels).sum().clamp(min=1)
    return num_items_in_batch / labels.shape[-1]


def packed_question_answering_loss(
    outputs: Mapping[str, torch.Tensor], labels: torch.Tensor, num_items_in_batch: Any = None
) -> torch.Tensor:
    """The QA loss of packed rows: for each sequence, `(CE(start) + CE(end)) / 2` over its own tokens, averaged
    over the sequences (the mean over a batch of the same features run alone). A `compute_loss_func`.

    Args:
        outputs (`Mapping[str, torch.Tensor]`): the model's outputs, with `start_logits` and `end_logits`
            `(batch, seq)`.
        labels (`torch.Tensor`): `(batch, slots, 4)` from `PackedDataCollator`.
        num_items_in_batch (*optional*): `Trainer`'s count of non -100 label entries over the accumulated batches;
            the sum of losses is divided by the sequences it counts. Without it, the mean over this batch.
    """
    positions = torch.arange(outputs["start_logits"].shape[-1], device=labels.device)
    present = _present(labels)
    in_span = (positions >= labels[..., :1]) & (positions < labels[..., 1:2])  # (batch, slots, seq)
    in_span |= ~present[..., None]  # empty slots keep finite logits; their targets are ignored
    total = 0.0
    for logits, targets in ((outputs["start_logits"], labels[..., 2]), (outputs["end_logits"], labels[..., 3])):
        logits = logits.float()[:, None, :].expand(in_span.shape)
        masked = logits.masked_fill(~in_span, torch.finfo(torch.float32).min)
        total = total + F.cross_entropy(
            masked.reshape(-1, masked.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
    return total / 2 / _sequence_count(labels, num_items_in_batch)


def sequence_classification_logits(model: nn.Module, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Logits of every labelled sequence of packed rows: the model's own classification head applied to the
    last hidden state of each sequence's first token ([CLS]), as the model does for position 0 of a row.

    Args:
        model (`nn.Module`): a `...ForSequenceClassification` whose stage plan has a `sequence_head` (BERT,
            RoBERTa, DistilBERT).
        hidden_states (`torch.Tensor`): the last hidden states `(batch, seq, hidden)`.
        labels (`torch.Tensor`): `(batch, slots, 3)` from `PackedDataCollator` (their sequence starts are read).

    Returns:
        `torch.Tensor`: `(sequences, num_labels)`, labelled slots in row-major order.
    """
    rows, slots = _present(labels).nonzero(as_tuple=True)
    first = hidden_states[rows, labels[rows, slots, 0].long()][:, None, :]  # (sequences, 1, hidden)
    name, plan = type(model).__name__, plan_for_model(model)
    if plan.sequence_head is None or not name.endswith("ForSequenceClassification"):
        supported = sorted(c for p in registered_plans() if p.sequence_head for c in p.classes if "Sequence" in c)
        raise ValueError(
            f"sequence classification with packing: {name} is not supported ({', '.join(supported)} are); train it "
            "without packing"
        )
    return plan.sequence_head(model, first)


class PackedSequenceClassificationLoss:
    """The classification loss of packed rows, one label per sequence (a `Trainer` `compute_loss_func`).

    The model runs unchanged with `output_hidden_states=True` (pass it in the batch, or set
    `model.config.output_hidden_states = True`); `sequence_classification_logits` gives each sequence's logits.
    Cross-entropy for class labels, mean squared error for regression (`num_labels == 1`), as the model's own
    loss, averaged over the sequences. Unpacked batches (labels of one value per example, as in evaluation) get
    the model's own loss.

    Args:
        model (`nn.Module`): the model whose head is applied (the stock model; a pipelined model's `.model`).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        if labels.dim() != 3:
            # Unpacked examples (evaluation): `Trainer` hands every batch's labels to its `compute_loss_func`,
            # so those get the model's own loss, computed from its logits
            return ForSequenceClassificationLoss(labels, outputs["logits"], self.model.config)
        hidden = getattr(outputs, "hidden_states", None)
        if hidden is None:
            raise ValueError(
                "packed classification needs the model's hidden states: call it with output_hidden_states=True"
            )
        logits = sequence_classification_logits(self.model, hidden[-1], labels).float()
        targets = labels[..., 2][_present(labels)]
        if self.model.config.num_labels == 1:
            losses = F.mse_loss(logits.squeeze(-1), targets.float(), reduction="sum")
        else:
            losses = F.cross_entropy(logits, targets.long(), reduction="sum")
        return losses / _sequence_count(labels, num_items_in_batch)


def unpack_logits(
    logits: torch.Tensor | np.ndarray,
    packed: Mapping[str, Sequence],
    pad_to: int | None = None,
    fill: float = -100.0,
) -> list[Any] | torch.Tensor | np.ndarray:
    """Per-token outputs of packed rows back to one entry per original feature.

    Args:
        logits (`torch.Tensor` or `np.ndarray`): `(rows, seq, ...)` outputs of the packed rows, in the order of
            `packed` (e.g. QA `start_logits` from `Trainer.predict`).
        packed (`Mapping[str, Sequence]`): what `pack_features` returned (or its dataset): `feature_index` and
            `sequence_lengths` per row.
        pad_to (`int`, *optional*): return one array `(features, pad_to, ...)`, each feature's values first and
            `fill` after them (the layout of unpacked, padded features), instead of a list.
        fill (`float`, *optional*, defaults to -100.0): the value after each feature's tokens with `pad_to`.

    Returns:
        a list (feature order) of `(length, ...)` slices, or the padded array / tensor with `pad_to`.
    """
    index_rows, length_rows = _column(packed, "feature_index"), _column(packed, "sequence_lengths")
    if index_rows is None or length_rows is None:
        raise ValueError("unpack_logits: `packed` needs the 'feature_index' and 'sequence_lengths' of pack_features")
    if len(index_rows) != len(logits):
        raise ValueError(f"unpack_logits: {len(logits)} rows of logits for {len(index_rows)} packed rows")
    pieces: dict[int, Any] = {}
    for row, (indices, lengths) in enumerate(zip(index_rows, length_rows, strict=True)):
        start = 0
        for index, length in zip(indices, lengths, strict=True):
            if index in pieces:
                raise ValueError(f"unpack_logits: feature {index} appears in two packed rows")
            pieces[index] = logits[row, start : start + length]
            start += length
    if sorted(pieces) != list(range(len(pieces))):
        missing = sorted(set(range(max(pieces) + 1)) - set(pieces))
        raise ValueError(f"unpack_logits: features {missing[:10]} are in no packed row")
    ordered = [pieces[i] for i in range(len(pieces))]
    if pad_to is None:
        return ordered
    shape = (len(ordered), pad_to, *logits.shape[2:])
    if isinstance(logits, torch.Tensor):
        out = torch.full(shape, fill, dtype=logits.dtype, device=logits.device)
    else:
        out = np.full(shape, fill, dtype=np.asarray(logits).dtype)
    for i, piece in enumerate(ordered):
        if len(piece) > pad_to:
            raise ValueError(f"unpack_logits: feature {i} has {len(piece)} tokens, more than pad_to={pad_to}")
        out[i, : len(piece)] = piece
    return out


__all__ = [
    "pack_sequences",
    "pack_features",
    "PACKING_ATTENTIONS",
    "check_packing_support",
    "packing_attention",
    "position_offset",
    "packed_attention_mask",
    "PACKED_SEQUENCE_IDS",
    "packed_block_mask",
    "with_packed_block_mask",
    "PackedDataCollator",
    "packed_question_answering_loss",
    "sequence_classification_logits",
    "PackedSequenceClassificationLoss",
    "unpack_logits",
]
