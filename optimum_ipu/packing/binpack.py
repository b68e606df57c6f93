"""Which features share a row: best-fit decreasing bin packing, the packed columns, and the way back
(`unpack_logits`). No torch needed to pack; numpy or torch outputs to unpack."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

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
