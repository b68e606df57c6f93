"""The work of `optimum-ipu benchmark --packing`: real SQuAD feature lengths, packed rows and padded features.

N SQuAD v1.1 training features, their token counts drawn with a fixed seed from the histogram shipped with the
package (`optimum_ipu/data/squad_v1.1_feature_lengths_seq384.json`, made by `benchmarks/squad_feature_lengths.py`
from 40 articles of the dev set tokenized as `run_qa.py` does at `max_length=384`, `stride=128`), with random token
ids and an answer span inside each feature. Every runner trains on the same N features:

- ours on rows of `seq_len` tokens packed by `pack_sequences` (best-fit decreasing), laid out by `pack_features`,
  through `PackedDataCollator` and `packed_question_answering_loss`, `batch_size` rows per optimizer step;
- the baselines on the features padded to `seq_len` (as the reference recipe runs them), `batch_size` features per
  optimizer step.

N is the largest multiple of `batch_size` whose features pack into at most `steps x batch_size` rows, so that ours
runs exactly `steps` full steps and the baselines whole steps (about packing-factor times `steps`); rows short of
`steps x batch_size` are made by moving one feature out of the fullest rows into a row of its own (a few rows,
reported as `rows_split`). With `seq_len` below the histogram's 384 tokens, the lengths are scaled down by
`seq_len / 384` (rounded up), which keeps the shape of the distribution (tiny test runs); above it, they are used
as they are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..packing import IGNORE_INDEX, pack_features, pack_sequences, packed_question_answering_loss

FEATURE_LENGTHS_FILE = Path(__file__).resolve().parents[1] / "data" / "squad_v1.1_feature_lengths_seq384.json"


def load_feature_lengths(path: str | Path = FEATURE_LENGTHS_FILE) -> dict[str, Any]:
    """The SQuAD feature-length file: its provenance fields, and `histogram` as `{length: count}` (integers).

    Args:
        path (`str` or `Path`, *optional*): the JSON file (default: the one shipped in `optimum_ipu/data/`).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"--packing: the SQuAD feature-length file {path} is missing; regenerate it with "
            "`python benchmarks/squad_feature_lengths.py` (or reinstall optimum-ipu, which ships it)"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    data["histogram"] = {int(length): int(count) for length, count in data["histogram"].items()}
    return data


def sample_feature_lengths(
    histogram: Mapping[int, int], count: int, seq_len: int, max_length: int | None = None, seed: int = 0
) -> list[int]:
    """Draw `count` feature lengths from a histogram, with replacement, with a fixed seed.

    The draws are inverse-CDF lookups of `numpy`'s uniform numbers in order, so a shorter draw with the same seed
    is a prefix of a longer one. Lengths above `seq_len` cannot occur in features tokenized at `seq_len`: when
    `seq_len < max_length`, every length is scaled by `seq_len / max_length` and rounded up (1 to `seq_len`).

    Args:
        histogram (`Mapping[int, int]`): `{length: count}` of the real features (lengths from 1 to `max_length`).
        count (`int`): how many lengths to draw.
        seq_len (`int`): tokens of a row (the longest a returned length can be).
        max_length (`int`, *optional*): the `max_length` the histogram was tokenized at (default: its longest).
        seed (`int`, *optional*, defaults to 0): the seed of the draw.

    Returns:
        `list[int]`: `count` lengths, each from 1 to `seq_len`.
    """
    if seq_len < 1:
        raise ValueError(f"--seq-len {seq_len}: expected a positive number of tokens")
    lengths = np.array(sorted(histogram), dtype=np.int64)
    counts = np.array([histogram[length] for length in lengths], dtype=np.float64)
    max_length = int(lengths.max()) if max_length is None else max_length
    if lengths.min() < 1 or lengths.max() > max_length or counts.min() < 0 or counts.sum() <= 0:
        raise ValueError(f"feature-length histogram: expected counts of lengths 1 to {max_length}, some positive")
    cdf = np.cumsum(counts) / counts.sum()
    draws = np.random.default_rng(seed).random(count)
    picked = lengths[np.minimum(np.searchsorted(cdf, draws, side="right"), len(lengths) - 1)]
    if seq_len < max_length:
        picked = np.maximum(1, np.ceil(picked * seq_len / max_length)).astype(np.int64)
    return picked.tolist()


@dataclass
class PackingWorkload:
    """The same N features for every runner: as packed rows (ours) and as padded batches (the baselines).

    Args:
        lengths (`list[int]`): tokens of each feature.
        input_ids (`list[list[int]]`): random token ids of each feature.
        start_positions (`list[int]`), end_positions (`list[int]`): each feature's answer span, inside it.
        rows (`list[list[int]]`): the features of each packed row (`steps x batch_size` rows).
        seq_len (`int`): tokens of a row (packed) and of a padded feature.
        batch_size (`int`): rows (ours) or features (baselines) per optimizer step.
        rows_split (`int`): rows made by moving a feature out of a full row (see the module's docstring).
    """

    lengths: list[int]
    input_ids: list[list[int]]
    start_positions: list[int]
    end_positions: list[int]
    rows: list[list[int]]
    seq_len: int
    batch_size: int
    rows_split: int

    @property
    def num_features(self) -> int:
        return len(self.lengths)

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def mean_length(self) -> float:
        return self.real_tokens / self.num_features

    @property
    def max_features_per_row(self) -> int:
        return max(map(len, self.rows))

    @property
    def padded_steps(self) -> int:
        return self.num_features // self.batch_size

    def packed_rows(self) -> list[dict[str, list[int]]]:
        """Each row laid out by `pack_features` (its features' tokens one after the other, positions restarting
        at 0, answer positions moved to the row): what `PackedDataCollator` takes."""
        out = []
        for row in self.rows:
            packed = pack_features(
                {
                    "input_ids": [self.input_ids[i] for i in row],
                    "start_positions": [self.start_positions[i] for i in row],
                    "end_positions": [self.end_positions[i] for i in row],
                },
                self.seq_len,
            )
            if len(packed["input_ids"]) != 1:  # features that fit in one row pack into one row
                raise RuntimeError(f"pack_features made {len(packed['input_ids'])} rows of one row's features")
            keys = ("input_ids", "token_type_ids", "position_ids", "start_positions", "end_positions")
            out.append({key: packed[key][0] for key in keys})
        return out

    @cached_property
    def padded_batches(self) -> list[dict[str, torch.Tensor]]:
        """The features padded to `seq_len` (id 0, attention mask 0), `batch_size` per batch, in drawn order."""
        size, length = self.num_features, self.seq_len
        input_ids = torch.zeros((size, length), dtype=torch.long)
        attention_mask = torch.zeros((size, length), dtype=torch.long)
        for i, ids in enumerate(self.input_ids):
            input_ids[i, : len(ids)] = torch.as_tensor(ids)
            attention_mask[i, : len(ids)] = 1
        start, end = torch.as_tensor(self.start_positions), torch.as_tensor(self.end_positions)
        step = self.batch_size
        return [
            {
                "input_ids": input_ids[i : i + step],
                "attention_mask": attention_mask[i : i + step],
                "start_positions": start[i : i + step],
                "end_positions": end[i : i + step],
            }
            for i in range(0, size, step)
        ]

    def summary(self) -> dict[str, Any]:
        """What the report's `packing` entry holds about the work (provenance added by the caller)."""
        rows = len(self.rows)
        return {
            "features": self.num_features,
            "real_tokens": self.real_tokens,
            "mean_feature_length": round(self.mean_length, 2),
            "rows": rows,
            "rows_split": self.rows_split,
            "max_features_per_row": self.max_features_per_row,
            "packing_factor": self.num_features / rows,
            "padding_fraction": {
                "packed": 1 - self.real_tokens / (rows * self.seq_len),
                "padded": 1 - self.real_tokens / (self.num_features * self.seq_len),
            },
            "steps": {"packed": rows // self.batch_size, "padded": self.padded_steps},
        }


def _fill_rows(rows: list[list[int]], target: int) -> int:
    """Move single features out of the fullest rows into rows of their own until there are `target` rows."""
    split = 0
    while len(rows) < target:
        fullest = max(range(len(rows)), key=lambda r: (len(rows[r]), -r))
        if len(rows[fullest]) < 2:
            raise RuntimeError(f"{len(rows)} rows of one feature each: {target} rows cannot be made")
        rows.append([rows[fullest].pop()])
        split += 1
    return split


def build_workload(
    histogram: Mapping[int, int],
    seq_len: int,
    batch_size: int,
    steps: int,
    vocab_size: int,
    max_length: int | None = None,
    seed: int = 0,
) -> PackingWorkload:
    """The features of a `--packing` run: the largest multiple of `batch_size` that packs into `steps x batch_size`
    rows (see the module's docstring), with random ids (1 to `vocab_size - 1`) and answer spans.

    Args:
        histogram (`Mapping[int, int]`): `{length: count}` of the real features.
        seq_len (`int`): tokens of a row.
        batch_size (`int`): rows of one of our optimizer steps; features of one baseline step.
        steps (`int`): our optimizer steps.
        vocab_size (`int`): the model's vocabulary.
        max_length (`int`, *optional*): the `max_length` the histogram was tokenized at.
        seed (`int`, *optional*, defaults to 0): the seed of the lengths and of the ids and answer spans.
    """
    target = steps * batch_size
    max_length = max(histogram) if max_length is None else max_length
    smallest = min(histogram) if seq_len >= max_length else math.ceil(min(histogram) * seq_len / max_length)
    # enough features to overfill the rows: more tokens than `target` rows hold, even if all were the shortest
    pool = sample_feature_lengths(histogram, target * (seq_len // smallest + 1), seq_len, max_length, seed)

    def rows_of(k: int) -> list[list[int]]:
        return pack_sequences(pool[: k * batch_size], seq_len)

    # hi: the fewest batches whose tokens exceed the rows' room (they cannot fit); lo: a count that fits, from the
    # usual ~95% fill of best-fit decreasing. Then bisect for the most batches that fit.
    tokens = np.cumsum(pool[: (len(pool) // batch_size) * batch_size])[batch_size - 1 :: batch_size]
    hi = int(np.searchsorted(tokens, target * seq_len, side="right")) + 1
    lo = max(1, min(hi - 1, int(0.9 * target * seq_len / (float(np.mean(pool)) * batch_size))))
    while lo > 1 and len(rows_of(lo)) > target:
        lo //= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(rows_of(mid)) <= target else (lo, mid)
    rows = rows_of(lo)
    split = _fill_rows(rows, target)
    lengths = pool[: lo * batch_size]
    rng = np.random.default_rng(seed + 1)
    input_ids = [rng.integers(1, vocab_size, size=length).tolist() for length in lengths]
    start = [int(rng.integers(0, length)) for length in lengths]
    end = [int(rng.integers(s, length)) for s, length in zip(start, lengths, strict=True)]
    return PackingWorkload(lengths, input_ids, start, end, rows, seq_len, batch_size, split)


class RowDataset(torch.utils.data.Dataset):
    """A list of rows (dicts) as a map-style dataset."""

    def __init__(self, rows: Sequence[dict]) -> None:
        self.rows = list(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


class FeatureCountingLoss:
    """`packed_question_answering_loss`, also counting the features of each optimizer step: a packed step holds a
    varying number of them, and `Trainer` shuffles the rows. The counts stay on the device (no host sync).

    Args:
        current_step (`Callable[[], int]`): the index of the optimizer step being run (the steps timed so far).
    """

    def __init__(self, current_step: Callable[[], int]) -> None:
        self.current_step = current_step
        self.counts: list[tuple[int, torch.Tensor]] = []

    def __call__(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        self.counts.append((self.current_step(), (labels[..., 0] != IGNORE_INDEX).sum()))
        return packed_question_answering_loss(outputs, labels, num_items_in_batch)

    def per_step(self, steps: int) -> list[int]:
        """Features of each of the first `steps` optimizer steps."""
        totals = [0] * steps
        for step, count in self.counts:
            if step < steps:
                totals[step] += int(count)
        return totals


def feature_flops(lengths: Sequence[int], flops_of_length: Callable[[int], float]) -> float:
    """Mean model FLOPs of a feature: `flops_of_length` at each feature's own length (its real tokens).

    A transformer's FLOP count is a quadratic polynomial of the length (linear layers, then attention's `s^2`), so
    it is counted at three lengths and the polynomial through them gives the others (each count is a forward and
    backward pass: hundreds of distinct lengths would take minutes)."""
    distinct = sorted(set(lengths))
    if len(distinct) <= 3:
        counts = {length: flops_of_length(length) for length in distinct}
        return sum(counts[length] for length in lengths) / max(1, len(lengths))
    at = [distinct[0], distinct[len(distinct) // 2], distinct[-1]]
    polynomial = np.polyfit(at, [flops_of_length(length) for length in at], deg=2)
    return float(np.polyval(polynomial, np.asarray(lengths, dtype=np.float64)).mean())


def check_packing_arguments(mode: str, task: str) -> None:
    """`--packing` packs SQuAD features for question-answering training: a clear error for anything else."""
    if mode != "train":
        raise ValueError(f"--packing with --mode {mode}: packing measures training; use --mode train")
    if task != "question-answering":
        raise ValueError(
            f"--packing with --task {task}: packing trains on SQuAD feature lengths; use --task question-answering"
        )


__all__ = [
    "FEATURE_LENGTHS_FILE",
    "load_feature_lengths",
    "sample_feature_lengths",
    "PackingWorkload",
    "build_workload",
    "RowDataset",
    "FeatureCountingLoss",
    "feature_flops",
    "check_packing_arguments",
]
