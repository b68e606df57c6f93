"""Packed inference: several texts a row, each text's outputs as if it ran alone (Optimum Graphcore's packed-BERT
notebooks' `PackedBertTextClassificationPipeline` and packed question answering, on the stock model).

Short texts padded to a full row spend most of the compute on padding; packed, one row holds several, with the
block-diagonal attention and restarted positions of `optimum_ipu.packing` so that no text sees another. Each
text's logits equal those of the text run alone (tested to float tolerance against unpacked runs).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from .binpack import pack_features
from .collator import collator_for
from .losses import sequence_classification_logits
from .masks import check_packing_support, with_packed_block_mask


def _packed_batches(model: nn.Module, features: dict[str, list], max_seq_length: int, pad_token_id: int, **pack):
    """Pack `features` and yield `(rows' packed columns, model inputs, label slots)` a batch of `batch_size` rows."""
    check_packing_support(model, training=False)
    batch_size = pack.pop("batch_size")
    packed = pack_features(features, max_seq_length, pack.pop("max_sequences_per_row"))
    collate = collator_for(model, max_seq_length, max(map(len, packed["feature_index"])), pad_token_id)
    columns = [name for name in ("input_ids", "token_type_ids", "position_ids", "labels") if name in packed]
    rows = [{name: packed[name][r] for name in columns} for r in range(len(packed["input_ids"]))]
    for start in range(0, len(rows), batch_size):
        batch = collate(rows[start : start + batch_size])
        slots = batch.pop("labels", None)
        if "token_type_ids" not in _forward_names(model):
            batch.pop("token_type_ids", None)
        batch = with_packed_block_mask({k: v.to(model.device) for k, v in batch.items()})
        chunk = {name: packed[name][start : start + batch_size] for name in ("feature_index", "sequence_lengths")}
        yield chunk, batch, slots


def _forward_names(model: nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)  # DistilBERT takes no token_type_ids


def _tokenized(tokenizer: Any, texts: Sequence[Any], text_pairs: Sequence[Any] | None, max_seq_length: int) -> dict:
    pairs = list(text_pairs) if text_pairs is not None else None
    encoded = tokenizer(list(texts), pairs, truncation=True, max_length=max_seq_length)  # no padding: packed
    return {name: encoded[name] for name in ("input_ids", "token_type_ids") if name in encoded}


@torch.inference_mode()
def predict_packed_classification(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None = None,
    max_seq_length: int = 128,
    max_sequences_per_row: int | None = None,
    batch_size: int = 8,
) -> np.ndarray:
    """Sequence classification logits of `texts` (and `text_pairs`), several texts packed a row.

    Args:
        model (`nn.Module`): a `...ForSequenceClassification` of a family that packs (BERT, RoBERTa, DistilBERT;
            `check_packing_support` says so otherwise), in `eval()` mode.
        tokenizer: its tokenizer.
        texts (`Sequence[str]`): the texts (first segments).
        text_pairs (`Sequence[str]`, *optional*): second segments, one a text.
        max_seq_length (`int`, *optional*, defaults to 128): tokens of a row; a longer text is truncated to it.
        max_sequences_per_row (`int`, *optional*): at most this many texts a row (Optimum Graphcore's
            `max_seq_per_pack`).
        batch_size (`int`, *optional*, defaults to 8): packed rows a forward pass.

    Returns:
        `np.ndarray`: `(len(texts), num_labels)` float32 logits, in the order of `texts`.
    """
    features = _tokenized(tokenizer, texts, text_pairs, max_seq_length)
    features["labels"] = [0] * len(texts)  # a slot a text: the collator then records where each one starts
    logits = [None] * len(texts)
    pack = {"max_sequences_per_row": max_sequences_per_row, "batch_size": batch_size}
    for chunk, batch, slots in _packed_batches(model, features, max_seq_length, tokenizer.pad_token_id or 0, **pack):
        hidden = model(**batch, output_hidden_states=True).hidden_states[-1]
        values = sequence_classification_logits(model, hidden, slots.to(hidden.device)).float().cpu().numpy()
        order = [index for row in chunk["feature_index"] for index in row]  # row-major, as the slots
        for index, value in zip(order, values, strict=True):
            logits[index] = value
    return np.stack(logits)


@torch.inference_mode()
def predict_packed_question_answering(
    model: nn.Module,
    features: dict[str, list],
    max_seq_length: int = 384,
    pad_token_id: int = 0,
    max_sequences_per_row: int | None = None,
    batch_size: int = 8,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Start and end logits of question-answering features (tokenized without padding), several a row.

    Args:
        model (`nn.Module`): a `...ForQuestionAnswering` of a family that packs, in `eval()` mode.
        features (`dict[str, list]`): `input_ids` (and `token_type_ids`) a feature, as the tokenizer gives them
            with `padding=False`; post-processing reads the other columns (offsets) from the same features.
        max_seq_length (`int`, *optional*, defaults to 384): tokens of a row.
        pad_token_id (`int`, *optional*, defaults to 0): the tokenizer's padding id.
        max_sequences_per_row (`int`, *optional*): at most this many features a row.
        batch_size (`int`, *optional*, defaults to 8): packed rows a forward pass.

    Returns:
        `(start_logits, end_logits)`: one float32 array a feature, of its own length, in the order of `features`.
    """
    columns = {name: features[name] for name in ("input_ids", "token_type_ids") if name in features}
    pieces: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    pack = {"max_sequences_per_row": max_sequences_per_row, "batch_size": batch_size}
    for chunk, batch, _ in _packed_batches(model, columns, max_seq_length, pad_token_id, **pack):
        outputs = model(**batch)
        start_rows, end_rows = (x.float().cpu().numpy() for x in (outputs.start_logits, outputs.end_logits))
        for r, (indices, lengths) in enumerate(zip(chunk["feature_index"], chunk["sequence_lengths"], strict=True)):
            offsets = np.cumsum([0, *lengths[:-1]])
            for index, offset, length in zip(indices, offsets, lengths, strict=True):
                pieces[index] = (start_rows[r, offset : offset + length], end_rows[r, offset : offset + length])
    ordered = [pieces[i] for i in range(len(pieces))]
    return [start for start, _ in ordered], [end for _, end in ordered]
