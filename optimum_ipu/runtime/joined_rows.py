"""Decoding whose rows join and leave a running batch (continuous batching), in one process or on every process of a
model split over processes (inference tensor parallelism, where each process runs the whole model's steps on its
share of every layer).

`transformers`' continuous batching managers drive a model whole in one process from a thread of their own, choosing
each step's requests as they arrive: processes running the split model's steps together would choose differently.
Here one process leads: before each step it says which rows end and which prompts join (`RowsControl`), and every
process then makes the same calls with the same shapes, so the split layers' exchanges pair up:

- a joining prompt is run alone first (its prefill: left-padded with the other joining prompts), giving its KV cache
  and first token; its cache is then put beside the running rows' caches, the shorter ones padded on the left (masked
  out), so that every row's last token is in the same column;
- a step decodes one token for every row: `input_ids` the rows' last tokens, `attention_mask` the rows' columns,
  `position_ids` each row's own count of real tokens (so a row's positions are those it has alone);
- a row that ends leaves the cache (`batch_select_indices`), and the columns no row uses any more go.

Tokens are chosen alike on every process: greedy rows take the argmax, sampled rows draw through `transformers`'
temperature and top-p processors from one generator seeded alike everywhere (the logits are the same bits on every
process: the split sums its shares in rank order). What the leader decides crosses the processes only when something
changes: a one-element sum a step (through the split's shared memory where it has one), then the control itself.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from .host_collectives import HostCollectives, registered


@dataclasses.dataclass
class RowsControl:
    """What the leading process decides before a step: the running rows that end (their indices), the prompts that
    join (token ids and each one's sampling: temperature 0 is greedy), and whether the decoding ends (no row left)."""

    ends: list[int] = dataclasses.field(default_factory=list)
    joins: list[list[int]] = dataclasses.field(default_factory=list)
    sampling: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (temperature, top_p) a join
    finished: bool = False

    @property
    def changes(self) -> bool:
        return bool(self.ends or self.joins or self.finished)


def rows_can_join(config: Any) -> bool:
    """Whether a `DynamicCache` of `config`'s layers keeps every position of every row (no sliding window), so that
    rows of other lengths can be put beside its rows."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


class JoinedRows:
    """The rows decoding together in this process: their KV cache, attention mask and last tokens.

    Args:
        model (`nn.Module`): a `transformers` causal language model (or its split shares), in evaluation mode.
        seed (`int`): the sampling generator's seed, the same on every process that runs these rows.
    """

    def __init__(self, model: Any, seed: int) -> None:
        if not rows_can_join(model.config):
            raise ValueError(
                f"{type(model).__name__}: its KV cache has sliding-window or other non-growing layers, which "
                "rows cannot join; serve it without --continuous-batching"
            )
        self.model = model
        self.config = model.config
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.tokens = torch.zeros(0, dtype=torch.long)
        self.sampling: list[tuple[float, float]] = []
        self.generator = torch.Generator().manual_seed(seed)
        # (`transformers` 5.2x names the cache argument `cache`; before, `past_key_values`)
        self.cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @property
    def rows(self) -> int:
        return len(self.sampling)

    def end(self, rows: list[int]) -> None:
        """Drop `rows` (indices of the running rows), and the columns no remaining row uses."""
        if not rows:
            return
        ending = set(rows)
        keep = [r for r in range(self.rows) if r not in ending]
        self.sampling = [self.sampling[r] for r in keep]
        if not keep:
            self.cache, self.mask, self.tokens = None, self.mask[:0, :0], self.tokens[:0]
            return
        index = torch.tensor(keep)
        self.cache.batch_select_indices(index)
        self.mask, self.tokens = self.mask[index], self.tokens[index]
        first = int(self.mask.any(0).nonzero()[0])
        if first:
            layers = [(layer.keys[:, :, first:], layer.values[:, :, first:]) for layer in self.cache.layers]
            self.cache, self.mask = DynamicCache(ddp_cache_data=layers, config=self.config), self.mask[:, first:]

    def join(self, prompts: list[list[int]], sampling: list[tuple[float, float]]) -> torch.Tensor:
        """Run `prompts` (token ids) together, put them beside the running rows, and return their first tokens."""
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        cache = DynamicCache(config=self.config)
        logits = self._forward(ids, mask, cache)
        first = self._choose(logits, sampling)
        if self.cache is None:
            self.cache, self.mask, self.tokens = cache, mask, first
        else:
            self.cache, self.mask = self._beside(cache, mask)
            self.tokens = torch.cat([self.tokens, first])
        self.sampling += sampling
        return first

    def _beside(self, cache: DynamicCache, mask: torch.Tensor) -> tuple[DynamicCache, torch.Tensor]:
        """The running rows' cache and mask with `cache` / `mask`'s rows below, both padded on the left to the
        longer one's columns."""
        columns = max(self.mask.shape[1], mask.shape[1])

        def left(x: torch.Tensor, dim: int) -> torch.Tensor:  # zeros before the first column, along `dim` from the end
            pad = columns - x.shape[dim]
            return x if pad == 0 else F.pad(x, (0, 0) * (-dim - 1) + (pad, 0))

        layers = [
            (torch.cat([left(a.keys, -2), left(b.keys, -2)]), torch.cat([left(a.values, -2), left(b.values, -2)]))
            for a, b in zip(self.cache.layers, cache.layers, strict=True)
        ]
        return DynamicCache(ddp_cache_data=layers, config=self.config), torch.cat([left(self.mask, -1), left(mask, -1)])

    def step(self) -> torch.Tensor:
        """Decode one token for every running row; the tokens."""
        self.mask = torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long)], dim=1)
        logits = self._forward(self.tokens[:, None], self.mask, self.cache)
        self.tokens = self._choose(logits, self.sampling)
        return self.tokens

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """The last position's logits (float32) of `ids` after `cache`, each row's positions counted from its first
        real token (as `generate()` counts them from the attention mask)."""
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        with torch.inference_mode():
            inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, self.cache_argument: cache}
            out = self.model(**inputs, use_cache=True)
        return out.logits[:, -1].float()

    def _choose(self, logits: torch.Tensor, sampling: list[tuple[float, float]]) -> torch.Tensor:
        """Each row's next token: the argmax where its temperature is 0, else a draw after temperature and top-p."""
        tokens = logits.argmax(-1)
        for row, (temperature, top_p) in enumerate(sampling):
            if temperature <= 0:
                continue
            scores = TemperatureLogitsWarper(temperature)(None, logits[row : row + 1])
            if top_p < 1:
                scores = TopPLogitsWarper(top_p)(None, scores)
            tokens[row] = torch.multinomial(scores.softmax(-1), 1, generator=self.generator)[0, 0]
        return tokens


class RowsSchedule:
    """What the leading process's decoding asks of its server: `begin(groups)` once (the groups of rows decoding at
    once: 1, or one per stage through stages on processes), then for each group before each of its steps its
    `RowsControl` (`control(rows, group)`, given the group's rows running), and where the tokens go
    (`tokens(joined, stepped, group)`: the joining rows' first tokens, then every running row's token of the step,
    each a list or None). The groups decode in threads of their own: both are called from several threads at once."""

    def begin(self, groups: int) -> None:
        """The decoding starts, with `groups` groups of rows."""

    def control(self, rows: int, group: int) -> RowsControl:  # pragma: no cover - an interface
        raise NotImplementedError

    def tokens(self, joined: list[int] | None, stepped: list[int] | None, group: int) -> None:  # pragma: no cover
        raise NotImplementedError


def _agreed(control: RowsControl | None, group: Any, shared: HostCollectives | None) -> RowsControl:
    """The leader's `control` on every process of `group` (None elsewhere): a one-element sum (through `shared`,
    the group's shared memory, where it has one) says whether it changes anything; only then does the control itself
    travel."""
    if group is None:
        return control
    flag = torch.tensor([1 if control is not None and control.changes else 0], dtype=torch.int64)
    if shared is not None:
        shared.all_reduce(flag)
    else:
        dist.all_reduce(flag, group=group)
    if not flag.item():
        return RowsControl()
    message = [control]
    dist.broadcast_object_list(message, src=dist.get_global_rank(group, 0), group=group)
    return message[0]


def decode_joined(model: Any, seed: int, schedule: RowsSchedule | None = None, group: Any = None) -> None:
    """Decode rows that join and leave until the leader says it is finished (see the module docstring).

    Args:
        model (`nn.Module`): this process's causal language model (whole, or its split shares).
        seed (`int`): the sampling seed, the same on every process.
        schedule (`RowsSchedule`, *optional*): on the leading process, what decides and receives; None on the others.
        group (`torch.distributed.ProcessGroup`, *optional*): the processes that run these rows together (their rank
            0 leads); by default every process of the job (`torchrun`), none in one process.
    """
    if group is None and dist.is_initialized() and dist.get_world_size() > 1:
        group = dist.group.WORLD
    if schedule is not None:
        schedule.begin(1)
    run_rows(JoinedRows(model, seed), schedule, group, registered(group) if group is not None else None)


def run_rows(
    rows: JoinedRows,
    schedule: RowsSchedule | None,
    group: Any,
    shared: HostCollectives | None = None,
    index: int = 0,
    idle: Callable[[], None] | None = None,
) -> None:
    """The decoding loop of one group of rows (`index`), until the leader says it is finished: each pass, the
    leader's control agreed over `group`, then the rows that end leave, the joining prompts' prefill runs (the running
    rows wait for the next pass) or else every row steps; a pass in which the group has no row calls `idle` (through
    stages, the group's turn passes)."""
    leads = schedule is not None
    while True:
        control = _agreed(schedule.control(rows.rows, index) if leads else None, group, shared)
        if control.finished:
            return
        rows.end(control.ends)
        joined = rows.join(control.joins, control.sampling).tolist() if control.joins else None
        stepped = rows.step().tolist() if rows.rows and not control.joins else None
        if joined is None and stepped is None and idle is not None:
            idle()
        if leads:
            schedule.tokens(joined, stepped, index)
