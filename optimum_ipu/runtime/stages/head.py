"""The output projection and its vocabulary cross-entropy shared by the stages of a replica, in evaluation.

At a large vocabulary the output projection and its loss cost as much as many layers (a random Llama of 8 layers of
512 with a 30,522-word vocabulary: about 45% of the model), and all of it sits on the last stage, which then bounds
the pipeline however whole layers are split. Optimum Graphcore places the projection's splits on several IPUs
(`serialized_projection_splits_per_ipu`); with the stages on separate processes, evaluation does the same with
`inference_serialized_projection_splits_per_ipu`: each stage computes the logits of its share of the vocabulary (its
splits over their sum; `[3, 1]` gives stage 0 three quarters), from the projection's input (each micro-batch's final
hidden states), which the last stage sends it. The whole logits never exist, so only the loss comes out: it serves an
evaluation that keeps the loss alone (`Trainer`'s `prediction_loss_only`, which `evaluate()` sets when there is no
`compute_metrics`); one that keeps the logits runs the projection on the last stage alone, as before.

The cross-entropy over the shares: each share's log-sum-exp of its logits and the logit of each label it holds travel
to the last stage (two numbers a token), which combines them (the log-sum-exp of the log-sum-exps, less the label's
logit) once its micro-batches are done. This is the arithmetic of `torch.distributed.tensor.parallel.loss_parallel`,
which is not used because its reductions are collectives inside the cross-entropy: every stage would wait there for
every other at each micro-batch (measured on 2 stages: 82 ms a micro-batch in it, where the share's own arithmetic
takes 47), where here no stage waits for a reduction.

A stage computes its share of micro-batch k once its layers have run micro-batch k + (its distance to the last stage),
which is when the last stage has finished k: it alternates between its layers and its share of the head. The hidden
states and the shares' numbers travel on a process group of their own, so that on NCCL they never queue behind the
activations sent from stage to stage. The last stage sends each stage its rows of the projection at the start of each
evaluation (`SplitHead.refresh`): they are the current weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..serialization import SerializedLinear, replace_module_everywhere
from .shapes import DTYPES, receive_described, send_described

# the projections whose output is `F.linear(hidden, weight, bias)`: what each stage's share computes (a wrapper that
# adds to it, LoRA's, is not one of them)
PLAIN_PROJECTIONS = (nn.Linear, SerializedLinear)
IGNORE_INDEX = -100  # the label without a loss, as transformers' loss functions take it
# config fields with which a `transformers` model changes its logits after the projection (Gemma 2 and 3's soft cap,
# Cohere's and Granite's scales, Falcon-H1's multiplier): the shares' numbers, taken from the projection's own output,
# would give another loss
LOGITS_AFTER_PROJECTION = ("final_logit_softcapping", "logit_scale", "logits_scaling", "lm_head_multiplier", "softcap")


class HiddenCapture(nn.Module):
    """Stands in for the output projection on the last stage: keeps its input (`captured`) and returns no logits
    (a last dimension of 0), which the model passes on as its `logits`."""

    def __init__(self) -> None:
        super().__init__()
        self.captured: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.captured = hidden
        return hidden.new_empty(*hidden.shape[:-1], 0)


def share_rows(vocabulary: int, splits: Sequence[int]) -> list[range]:
    """The vocabulary rows of each stage: its splits' part of the whole, in order (`[1, 1]`: two halves)."""
    total, bounds, seen = sum(splits), [0], 0
    for count in splits:
        seen += count
        bounds.append(vocabulary * seen // total)
    return [range(start, stop) for start, stop in zip(bounds, bounds[1:], strict=False)]


def split_head_refusal(model: nn.Module, splits: Sequence[int] | None, stages: int, loss_kind: str) -> str:
    """Why evaluation through `stages` stages on processes cannot share the output projection as `splits`
    (`inference_serialized_projection_splits_per_ipu`) says; `""` when it can, `"not asked"` when `splits` is None."""
    if splits is None:
        return "not asked"
    if len(splits) != stages:
        return f"it has {len(splits)} entries for {stages} stages on processes"
    if loss_kind not in ("causal", "masked"):
        return "the model's loss is not a cross-entropy over the vocabulary"
    getter = getattr(model, "get_output_embeddings", None)
    projection = getter() if callable(getter) else None
    if type(projection) not in PLAIN_PROJECTIONS:
        return f"its output projection ({type(projection).__name__}) is not a linear layer"
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    changed = [name for name in LOGITS_AFTER_PROJECTION if getattr(text_config, name, None) not in (None, 1, 1.0)]
    if changed:
        return f"the model changes its logits after the projection (config.{changed[0]})"
    return ""


def shared_head_hint(model: nn.Module, stages: int, loss_kind: str) -> str:
    """On the last stage, when evaluation runs its output projection there alone although the stages could share it:
    a line saying so when the projection holds a quarter or more of the stage's parameters (it then bounds the
    pipeline however whole layers are split), `""` otherwise. A stage's process holds its own parameters only, the
    others being on the meta device."""
    if split_head_refusal(model, [1] * stages, stages, loss_kind):
        return ""
    projection = model.get_output_embeddings()
    if projection.weight.device.type == "meta":
        return ""
    head = sum(p.numel() for p in projection.parameters())
    held = sum(p.numel() for p in model.parameters() if p.device.type != "meta")  # (a tied head counted once)
    if 4 * head < held:
        return ""
    share = head / held
    return (
        f"the output projection is {share:.0%} of the last stage's parameters and runs there alone in evaluation; "
        f"inference_serialized_projection_splits_per_ipu (say {[1] * stages}) shares it between the {stages} stages "
        "in an evaluation of the loss alone, the layers then split evenly (docs/distributed.md)"
    )


class SplitHead:
    """This stage's share of the output projection and of its cross-entropy (see the module docstring).

    Args:
        model (`nn.Module`): the stock model (the last stage holds its output projection).
        group (`ProcessGroup`): the stages of this replica, a group of their own (`head_group`).
        ranks (`Sequence[int]`): their global ranks, in stage order.
        splits (`Sequence[int]`): each stage's splits of the projection (the config's
            `inference_serialized_projection_splits_per_ipu`).
        shifts_labels (`bool`): a causal LM's loss: position t predicts token t + 1.

    Attributes:
        losses (`list[Tensor]`): on the last stage, after `finish`, each micro-batch's mean loss over its labels.
    """

    def __init__(
        self, model: nn.Module, group: Any, ranks: Sequence[int], splits: Sequence[int], shifts_labels: bool
    ) -> None:
        self.model, self.group, self.ranks, self.shifts_labels = model, group, list(ranks), shifts_labels
        self.splits = list(splits)
        self.position = self.ranks.index(dist.get_rank())
        self.is_last = self.position == len(self.ranks) - 1
        self.sharing: list[int] = []  # the other stages that hold rows (known at `refresh`)
        self.rows = range(0)
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.done = 0  # micro-batches whose share this stage has computed (or has none of)
        self.losses: list[torch.Tensor] = []
        self._capture = HiddenCapture()
        self._sending: list[Any] = []
        self._own: list[tuple[torch.Tensor | None, torch.Tensor]] = []  # last stage: its share's numbers, the labels

    def refresh(self, device: torch.device) -> None:
        """Every stage's rows of the projection, sent from the last stage (every stage of the replica calls it)."""
        projection = self.model.get_output_embeddings() if self.is_last else None
        if projection is not None:
            weight = projection.weight.detach()
            bias = projection.bias.detach() if projection.bias is not None else None
            sizes = [*weight.shape, bias is not None, DTYPES.index(weight.dtype)]
            header = torch.tensor(sizes, dtype=torch.int64, device=device)
        else:
            header = torch.empty(4, dtype=torch.int64, device=device)
        dist.broadcast(header, src=self.ranks[-1], group=self.group)
        vocabulary, hidden, has_bias, dtype = header.tolist()
        shares = share_rows(vocabulary, self.splits)
        self.rows = shares[self.position]
        # by the rows they hold: a split of a vocabulary smaller than the splits' sum may hold none
        self.sharing = [rank for rank, rows in zip(self.ranks[:-1], shares, strict=False) if len(rows)]
        if projection is not None:
            sends = []
            for rank, rows in zip(self.ranks[:-1], shares, strict=False):
                if len(rows):
                    sends.append(dist.isend(weight[rows.start : rows.stop].contiguous(), dst=rank, group=self.group))
                if len(rows) and bias is not None:
                    sends.append(dist.isend(bias[rows.start : rows.stop].contiguous(), dst=rank, group=self.group))
            self.weight = weight[self.rows.start : self.rows.stop]
            self.bias = bias[self.rows.start : self.rows.stop] if bias is not None else None
            for work in sends:
                work.wait()
        elif len(self.rows):
            src = self.ranks[-1]
            self.weight = torch.empty(len(self.rows), hidden, dtype=DTYPES[dtype], device=device)
            dist.recv(self.weight, src=src, group=self.group)
            self.bias = torch.empty(len(self.rows), dtype=DTYPES[dtype], device=device) if has_bias else None
            if self.bias is not None:
                dist.recv(self.bias, src=src, group=self.group)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """On the last stage: within this context the model's output projection keeps its input and computes no
        logits (`HiddenCapture`); the projection is back on exit. Elsewhere: nothing."""
        if not self.is_last:
            yield
            return
        projection = self.model.get_output_embeddings()
        places = replace_module_everywhere(self.model, projection, self._capture)
        try:
            yield
        finally:
            for parent, name in places:
                setattr(parent, name, projection)

    def begin(self) -> None:
        """A new run of micro-batches: none done yet."""
        self.done, self.losses, self._own = 0, [], []

    def last_stage_part(self, labels: torch.Tensor) -> None:
        """On the last stage, after its forward of a micro-batch: send the captured hidden states to the stages that
        hold a share (without waiting), and compute its own share's numbers."""
        hidden = self._capture.captured.contiguous()  # once, for every stage it goes to
        for rank in self.sharing:
            self._sending += send_described((hidden,), rank, self.group)
        labels = self._labels(labels.to(hidden.device))
        self._own.append((self._numbers(hidden, labels) if len(self.rows) else None, labels))
        self.done += 1

    def other_stage_part(self, labels: torch.Tensor, device: torch.device) -> None:
        """On another stage: receive a micro-batch's hidden states from the last stage and send it this stage's
        share's numbers (nothing, for a stage without a share)."""
        self.done += 1
        if not len(self.rows):
            return
        (hidden,) = receive_described(self.ranks[-1], self.group, device)
        numbers = self._numbers(hidden, self._labels(labels.to(device)))
        self._sending.append(dist.isend(numbers, dst=self.ranks[-1], group=self.group))  # its work holds it until sent

    def finish(self) -> None:
        """After the run: on the last stage, each micro-batch's loss from every share's numbers (two numbers a token,
        taken once the run is done: no stage waits for them); every send done."""
        while self.is_last and len(self.losses) < len(self._own):
            self._collect()
        for work in self._sending:
            work.wait()
        self._sending, self._own = [], []

    def _collect(self) -> None:
        """On the last stage: the next micro-batch's loss from every share's numbers."""
        own, labels = self._own[len(self.losses)]
        numbers = [] if own is None else [own]  # in any order: the combination is symmetric in the shares
        for rank in self.sharing:
            numbers.append(torch.empty(2, labels.numel(), device=labels.device))
            dist.recv(numbers[-1], src=rank, group=self.group)
        self.losses.append(combined_loss(torch.stack(numbers), labels))

    def _labels(self, labels: torch.Tensor) -> torch.Tensor:
        """The labels the loss reads, flat: a causal LM's shifted (position t predicts token t + 1)."""
        return (labels[..., 1:] if self.shifts_labels else labels).reshape(-1)

    def _numbers(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """This share's numbers of a micro-batch (`share_numbers`) from its final hidden states."""
        hidden = hidden[..., :-1, :] if self.shifts_labels else hidden  # the last position predicts nothing
        # flat 2-D products: a sliced 3-D input runs as a batched product (1.27x slower at 8 x 127 x 512 on a CPU)
        hidden = hidden.reshape(-1, hidden.shape[-1])
        return chunked_share_numbers(hidden, self.weight, self.bias, labels, self.rows)


# a share's logits are computed over a few thousand words at a time, for all of a micro-batch's tokens (up to
# `CHUNK_TOKENS`), about `CHUNK_BYTES` each: a stage never holds a micro-batch's logits over its share at once, each
# chunk stays in the CPU's cache while its numbers are taken, and the share's weight is read once (in chunks of
# tokens, it was read once a chunk). The chunks' numbers combine as the shares' do (`combined_numbers`). Measured on
# an AMD EPYC with AVX2, one thread, 1,016 tokens over 16,957 words of 512: 216 ms in chunks of 2,048 words, against
# 418 ms in chunks of 128 tokens (the scheme before) and 402 ms whole; the same numbers within 2e-6
CHUNK_BYTES = 8 * 2**20
CHUNK_TOKENS = 2048  # more tokens are taken in parts of this many, so a chunk still spans 1,024 words or more


def chunked_share_numbers(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    rows: range,
    words: int | None = None,
    tokens: int = CHUNK_TOKENS,
) -> torch.Tensor:
    """`share_numbers` of the share's logits `F.linear(hidden, weight, bias)` (`hidden`: `(tokens, width)`),
    computed `tokens` at a time, each over `words` of the share's rows at a time (`chunk_words` by default)."""
    parts = []
    for at in range(0, hidden.shape[0], tokens):
        part_hidden, part_labels = hidden[at : at + tokens], labels[at : at + tokens]
        step = words or chunk_words(part_hidden.shape[0])
        numbers = [
            share_numbers(
                F.linear(part_hidden, weight[w : w + step], bias[w : w + step] if bias is not None else None),
                part_labels,
                range(rows.start + w, rows.start + min(w + step, len(rows))),
            )
            for w in range(0, len(rows), step)
        ]
        parts.append(combined_numbers(torch.stack(numbers)) if len(numbers) > 1 else numbers[0])
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def chunk_words(tokens: int) -> int:
    """Words whose logits for `tokens` tokens take about `CHUNK_BYTES` in fp32 (at least 1)."""
    return max(1, CHUNK_BYTES // (4 * max(tokens, 1)))


def share_numbers(logits: torch.Tensor, labels: torch.Tensor, rows: range) -> torch.Tensor:
    """What a share of the vocabulary (`rows`) tells of its `(tokens, len(rows))` logits, as `(2, tokens)` numbers:
    each token's log-sum-exp over them, and its label's logit where the share holds the label (0 elsewhere)."""
    logits = logits.float()  # as transformers' loss functions upcast before the cross-entropy
    held = (labels >= rows.start) & (labels < rows.stop)
    index = torch.where(held, labels - rows.start, 0).unsqueeze(1)
    label_logit = torch.where(held, logits.gather(1, index).squeeze(1), 0.0)
    # the log-sum-exp from log_softmax's fused kernel (any logit less its log-probability; within 2e-6 of
    # torch.logsumexp, which runs as four passes over the logits, 1.4x slower at 1,016 x 20,348 on a CPU)
    log_sum_exp = logits[:, 0] - torch.log_softmax(logits, dim=1)[:, 0]
    return torch.stack([log_sum_exp, label_logit])


def combined_numbers(numbers: torch.Tensor) -> torch.Tensor:
    """The `(2, tokens)` numbers of the union of disjoint parts of the vocabulary from theirs, `(parts, 2, tokens)`:
    the log-sum-exp of their log-sum-exps, and the sum of their label logits (a label is in one part at most)."""
    return torch.stack([torch.logsumexp(numbers[:, 0], dim=0), numbers[:, 1].sum(dim=0)])


def combined_loss(numbers: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over the labelled tokens from the shares' `(shares, 2, tokens)` numbers (`SplitHead`):
    each token's log-sum-exp over all the logits less its label's logit; NaN when no token is labelled, as
    `F.cross_entropy`'s mean."""
    log_sum_exp, label_logit = combined_numbers(numbers)
    losses = log_sum_exp - label_logit
    labelled = labels != IGNORE_INDEX
    return losses[labelled].sum() / labelled.sum()


def head_group(mesh: Any) -> tuple[Any, list[int]]:
    """A process group of its own joining the stages of this process's replica, and their global ranks in stage
    order: one `new_group` a replica of the `("dp", "pp")` mesh, made by every process of the job, in the same order."""
    replica = mesh.get_coordinate()[0]
    own: tuple[Any, list[int]] | None = None
    for r, stage_ranks in enumerate(mesh.mesh.tolist()):
        group = dist.new_group(stage_ranks)
        if r == replica:
            own = (group, stage_ranks)
    assert own is not None  # every process is in one replica of the mesh
    return own
