"""A training set none of whose labels is used (every one -100, the index the losses ignore) trains with loss 0.0 and
exits 0 having learned nothing; `check_some_label_used` refuses it before the first step.

Where the data is a `datasets.Dataset` holding its label column (`labels`, or `label` that the collators rename), the
column is read through Arrow in chunks, stopping at the first used label: a legit run reads one chunk, and only data
whose every label is ignored is read to its end (then refused). Data prepared on the fly (`set_transform`, a torch
`Dataset`) is not read here.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
CHUNK_ROWS = 10_000
WATCH_STEPS = 4  # optimizer steps of data prepared on the fly watched for a used label
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


def check_some_label_used(dataset: Any, name: str = "the training data") -> bool:
    """`ValueError` (one line naming the data, its label column and the flags to check) if `dataset` is a
    `datasets.Dataset` whose every label is -100. Returns whether the labels could be read (False: data prepared on
    the fly, no label column, labels that are not numbers), so that `UsedLabelWatch` watches the others."""
    columns = getattr(dataset, "column_names", None)
    fmt = getattr(dataset, "format", None)
    if not columns or not hasattr(dataset, "with_format") or (isinstance(fmt, dict) and fmt.get("type") == "custom"):
        return False
    column = next((c for c in LABEL_COLUMNS if c in columns), None)
    rows = len(dataset)
    if column is None or rows == 0:
        return False
    arrow = dataset.with_format("arrow")
    for start in range(0, rows, CHUNK_ROWS):
        used = _some_used(arrow[start : start + CHUNK_ROWS][column])
        if used is None or used:
            return used is not None
    raise ValueError(
        f"every label of {name} ({rows} rows, column {column!r}) is {IGNORE_INDEX} (ignored): the loss would be 0 "
        "and nothing learned; check --max_seq_length / --doc_stride (windows that cut every labelled token out) and "
        "the label column"
    )


class UsedLabelWatch:
    """For data prepared on the fly (which `check_some_label_used` cannot read): the labelled items of the first
    `steps` (`WATCH_STEPS`) optimizer steps of a run, counted on the device (no sync per micro-batch) and checked
    once, after those steps or the run's last one. None used in `steps` steps: the `ValueError` of
    `check_some_label_used`, naming the steps; in a shorter run, a warning (a few unlucky batches of sparse labels
    must not stop a legit run). Watches only a `labels` tensor, in one process (a refusal on one rank alone would
    leave the others waiting)."""

    def __init__(self, steps: int | None = None, enabled: bool = True) -> None:
        self.steps = steps = steps or WATCH_STEPS
        self.steps_left = steps if enabled else 0
        self.steps_seen, self.samples, self.used = 0, 0, None
        self.warned = False  # said that no label was used (a short run): the zero loss is said then

    def see(self, inputs: dict[str, Any]) -> None:
        """Count one micro-batch's used labels (before the loss, which may pop them)."""
        if self.steps_left <= 0:
            return
        labels = inputs.get("labels")
        if not hasattr(labels, "ne"):  # no token labels (QA positions, a model's own loss): nothing to watch
            self.steps_left = 0
            return
        count = labels.ne(IGNORE_INDEX).sum()
        self.used = count if self.used is None else self.used + count
        self.samples += int(labels.shape[0]) if labels.dim() else 1

    def step_done(self, last: bool) -> None:
        """An optimizer step ended (`last`: the run's last one); after the watched steps, the one check."""
        if self.steps_left <= 0 or self.used is None:
            return
        self.steps_left -= 1
        self.steps_seen += 1
        if self.steps_left > 0 and not last:
            return
        self.steps_left = 0
        if int(self.used) != 0:  # the run's one host sync for this
            return
        if self.steps_seen < self.steps:
            self.warned = True
            logger.warning(
                "every label of the %d optimizer steps of this run (%d samples) is %d (ignored): its loss is 0 and it "
                "learned nothing; check --max_seq_length / --doc_stride and the label column",
                self.steps_seen,
                self.samples,
                IGNORE_INDEX,
            )
            return
        raise ValueError(
            f"every label of the training data is {IGNORE_INDEX} (ignored) in the first {self.steps_seen} "
            f"optimizer steps ({self.samples} samples, column 'labels'): the loss is 0 and nothing is learned; "
            "check --max_seq_length / --doc_stride (windows that cut every labelled token out) and the label column"
        )


class ZeroLossWatch:
    """A run whose training loss is exactly 0 in each of its first `steps` (`WATCH_STEPS`) optimizer steps learns
    nothing (zero gradients) and exits 0: said once, in a warning (a loss of 0 may be legit later in a run, never
    from its start). Whether a loss was not 0 is kept on the device and read once, after those steps or the run's
    last one."""

    def __init__(self, steps: int | None = None, enabled: bool = True) -> None:
        self.steps = steps or WATCH_STEPS
        self.steps_left = self.steps if enabled else 0
        self.steps_seen, self.nonzero = 0, None

    def see(self, loss: Any) -> None:
        """One micro-batch's (or step's) loss, on the device."""
        if self.steps_left <= 0 or not hasattr(loss, "ne"):
            return
        flag = loss.detach().ne(0).any()
        self.nonzero = flag if self.nonzero is None else self.nonzero | flag

    def step_done(self, last: bool, said: bool = False) -> None:
        """An optimizer step ended; after the watched steps, the one check (`said`: the labels' watch already
        warned that no label was used, which is why)."""
        if self.steps_left <= 0 or self.nonzero is None:
            return
        self.steps_left -= 1
        self.steps_seen += 1
        if self.steps_left > 0 and not last:
            return
        self.steps_left = 0
        if said or bool(self.nonzero):  # the run's one host sync for this
            return
        logger.warning(
            "the training loss is exactly 0 in each of the first %d optimizer step(s) of this run: the gradients "
            "are 0 and nothing is learned; check the labels (every one ignored, -100?) and the model's loss",
            self.steps_seen,
        )
