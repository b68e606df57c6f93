"""A training set none of whose labels is used (every one -100, the index the losses ignore) trains with loss 0.0 and
exits 0 having learned nothing; `check_some_label_used` refuses it before the first step.

Where the data is a `datasets.Dataset` holding its label column (`labels`, or `label` that the collators rename), the
column is read through Arrow in chunks, stopping at the first used label: a legit run reads one chunk, and only data
whose every label is ignored is read to its end (then refused). Data prepared on the fly (`set_transform`, a torch
`Dataset`) is not read here.
"""

from __future__ import annotations

from typing import Any

IGNORE_INDEX = -100
CHUNK_ROWS = 10_000
LABEL_COLUMNS = ("labels", "label")


def _some_used(values: Any) -> bool | None:
    """Whether an Arrow column (lists nested any depth) holds a value other than -100; None if it cannot tell."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        while pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            values = pc.list_flatten(values)
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            return None
        return bool(pc.any(pc.not_equal(values, IGNORE_INDEX)).as_py())
    except (pa.ArrowException, TypeError, ValueError):
        return None


def check_some_label_used(dataset: Any, name: str = "the training data") -> None:
    """`ValueError` (one line naming the data, its label column and the flags to check) if `dataset` is a
    `datasets.Dataset` whose every label is -100; nothing for any other data, or one with a used label."""
    columns = getattr(dataset, "column_names", None)
    fmt = getattr(dataset, "format", None)
    if not columns or not hasattr(dataset, "with_format") or (isinstance(fmt, dict) and fmt.get("type") == "custom"):
        return
    column = next((c for c in LABEL_COLUMNS if c in columns), None)
    rows = len(dataset)
    if column is None or rows == 0:
        return
    arrow = dataset.with_format("arrow")
    for start in range(0, rows, CHUNK_ROWS):
        used = _some_used(arrow[start : start + CHUNK_ROWS][column])
        if used is None or used:
            return
    raise ValueError(
        f"every label of {name} ({rows} rows, column {column!r}) is {IGNORE_INDEX} (ignored): the loss would be 0 "
        "and nothing learned; check --max_seq_length / --doc_stride (windows that cut every labelled token out) and "
        "the label column"
    )
