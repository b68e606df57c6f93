"""Forward-only pipeline over processes: evaluation and prediction batches through the stages of one replica.

Each process runs its `StageModule` (the stock forward cut to its stage) on the batch it was given; stage i sends
its activations to stage i + 1, and the last stage returns the model's output. Nothing else travels, so no process
holds more than its stage.

A batch is split into micro-batches, several in flight through the stages (stage i runs micro-batch k while stage
i + 1 runs k - 1). Ours, not a `torch.distributed.pipelining` schedule's `eval`: its stages infer the activations'
shapes once, at the first step, while evaluation batches change shape (the last, smaller batch; sequence buckets).
Here each send carries its shapes first (one small tensor), so every micro-batch may have its own.

Generation through the stages is `stages.generation.StageGeneration`, built on `StageForward`; what travels is
described by a small header tensor (`stages.shapes`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..distributed import batches_of
from .cut import StageCut, StageModule, stage_ranges
from .hold import StageHold
from .shapes import receive_described, send_described

if TYPE_CHECKING:
    from .head import SplitHead


def _nothing(output: Any) -> torch.Tensor:
    return torch.zeros(1)  # the last stage's output is read from `StageModule.last_output`


class StageForward:
    """Runs batches forward through this process's stage (see the module docstring).

    Args:
        model (`nn.Module`): the stock model, holding at least this stage's parameters; in evaluation mode.
        cut (`StageCut`): its layers, embeddings and encoder-decoder split.
        counts (`Sequence[int]`): the layers of each stage, wildcards resolved.
        stage (`int`): this process's stage.
        group (`ProcessGroup`): the stages of this process's replica (the mesh's `"pp"` group).
        precision (`str`, *optional*, defaults to `"fp32"`): `"fp32"` or `"bf16"`.
        gate (`Callable`, *optional*): runs each stage forward (`StageHold.gate`; the FSDP root when sharded).
    """

    def __init__(
        self,
        model: nn.Module,
        cut: StageCut,
        counts: Sequence[int],
        stage: int,
        group: Any,
        precision: str = "fp32",
        gate: Any = None,
        chain: Sequence[int] | None = None,
        layers: range | None = None,
    ) -> None:
        # `chain`: the stages that take part, in order (all by default; generation runs an encoder-decoder's encoder
        # and decoder stages as two chains), and `layers` this stage's layers in the chain
        self.chain = list(chain) if chain is not None else list(range(len(counts)))
        self.stage, self.num_stages, self.group = self.chain.index(stage), len(self.chain), group
        layers = stage_ranges(counts)[stage] if layers is None else layers
        self.module = StageModule(
            model, cut, layers, self.stage, self.num_stages, ["?"], precision, _nothing, root=gate
        )

    def _rank(self, position: int) -> int:
        """The global rank of the process at `position` in the chain."""
        return dist.get_global_rank(self.group, self.chain[position])

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor]) -> Any:
        """This stage's part of `batch`'s forward: the model's output on the last stage, `None` on the others."""
        outputs = self.run([batch])
        return outputs[0] if outputs is not None else None

    @torch.no_grad()
    def run(
        self,
        micro_batches: list[dict[str, torch.Tensor]],
        head: SplitHead | None = None,
        labels: list[torch.Tensor] | None = None,
    ) -> list[Any] | None:
        """This stage's part of the forward of `micro_batches`, in order, several in flight: each is sent on without
        waiting for the next stage to take it (`isend`), so while stage i runs micro-batch k, stage i + 1 runs k - 1.
        Returns the model's output of each on the last stage, `None` on the others.

        With `head` (the output projection shared by the stages, `stages.head`), the micro-batches come without their
        `labels` (given apart, one a micro-batch): this stage computes its share of micro-batch k's loss once its
        layers have run micro-batch k + (its distance to the last stage), when the last stage has finished k; the
        losses are in `head.losses` on the last stage, whose outputs carry no logits."""
        module = self.module
        first = micro_batches[0]
        module.keys = [next(k for k, v in first.items() if torch.is_tensor(v))]  # stage 0 finds it by this tensor
        module.reset(micro_batches)
        device = first[module.keys[0]].device
        last = self.stage == self.num_stages - 1
        ahead = self.num_stages - 1 - self.stage  # micro-batches this stage's layers run ahead of its head share
        outputs, sending = [], []
        if head is not None:
            head.begin()
        with head.capturing() if head is not None else contextlib.nullcontext():
            for k, batch in enumerate(micro_batches):
                received = (batch[module.keys[0]],) if self.stage == 0 else self._receive(device)
                sent = module(*received)
                if last:
                    outputs.append(module.last_output)
                else:
                    sending.extend(self._send(sent if isinstance(sent, tuple) else (sent,)))
                if head is not None and last:
                    head.last_stage_part(labels[k])
                elif head is not None and k >= ahead:
                    head.other_stage_part(labels[k - ahead], device)
        while head is not None and head.done < len(micro_batches):  # the shares of the last few
            head.other_stage_part(labels[head.done], device)
        for work in sending:  # the tensors stay alive until the next stage has them
            work.wait()
        if head is not None:
            head.finish()
        return outputs if last else None

    def _send(self, tensors: tuple[torch.Tensor, ...]) -> list[Any]:
        """Send `tensors` to the next stage without waiting: a header tensor (their dtypes and shapes), then each."""
        return send_described(tensors, self._rank(self.stage + 1), self.group)

    def _receive(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        return receive_described(self._rank(self.stage - 1), self.group, device)


class PipelinedForward(nn.Module):
    """The model as `transformers.Trainer`'s evaluation sees it when its stages run on separate processes: called
    with a batch (the same batch on every stage of a replica), it splits it into micro-batches and runs them through
    the stages with several in flight (`StageForward.run`), so every stage is busy but while the first micro-batch
    fills the pipeline and the last one drains it.

    The last stage returns the model's output of the whole batch: the micro-batches' outputs concatenated, their
    losses weighted by the labelled items each holds (the loss one forward of the whole batch gives, up to rounding).
    The other stages return an output of the same class and shapes, filled with zeros: only its shapes travel (one
    small tensor), never the logits, since the layout keeps the last stage's predictions and losses only
    (`ProcessStagesLayout.gather`).

    Args:
        stage_forward (`StageForward`): this process's stage.
        model (`nn.Module`): the stock model (registered, so `eval()` reaches it).
        micro_batches (`int`): micro-batches a batch is split into (fewer when it has fewer rows).
        shifts_labels (`bool`, *optional*, defaults to `False`): the loss averages `labels[..., 1:]` (a causal LM),
            which counts a micro-batch's labelled items.
        everywhere (`bool`, *optional*, defaults to `False`): the last stage's output on every stage (its tensors
            broadcast as tensors), for a caller that reads it on each process (`pipeline()`, whose post-processing
            every process runs); zeros of its shapes otherwise.

    Attributes:
        rows_per_micro_batch (`int` or `None`): set, a batch is cut into micro-batches of this many rows (the last
            shorter) instead of `micro_batches` parts: the batches one process would run, a host call holding several
            (`ProcessStagesLayout.eval_device_iterations`). Each one's loss is then its own mean (as one process's
            batch's), and they are weighted by their rows, as `Trainer` weighs the losses of one process's batches:
            the evaluation loss is one process's.
        split_head (`SplitHead` or `None`): the output projection and its loss shared by the stages
            (`inference_serialized_projection_splits_per_ipu`), used for the batches whose loss alone is kept.
        loss_only (`bool`): the caller keeps the loss alone (`Trainer`'s `prediction_loss_only`), so a shared head
            may compute it without the logits (which the output then lacks).
    """

    def __init__(
        self,
        stage_forward: StageForward,
        model: nn.Module,
        micro_batches: int,
        shifts_labels: bool = False,
        everywhere: bool = False,
    ) -> None:
        super().__init__()
        self.stage_forward, self.model = stage_forward, model
        self.micro_batches, self.shifts_labels, self.everywhere = micro_batches, shifts_labels, everywhere
        self.rows_per_micro_batch: int | None = None
        self.split_head: SplitHead | None = None
        self.loss_only = False
        self._head_current = False

    def forward(self, **inputs: Any) -> Any:
        stages = self.stage_forward
        last = stages._rank(stages.num_stages - 1)
        # the last stage's batch on every stage: its labels are the ones the loss and the gathered metrics read
        device = next(v for v in inputs.values() if torch.is_tensor(v)).device
        inputs = batches_of(last, stages.group, [inputs], device)[0]
        # Each micro-batch's loss is the mean over its own items (`Trainer`'s count of the batch's, which a token-level
        # loss would divide its sum by, is kept out of them); the batch's is their sum, each mean times its items, over
        # that count (integer labels: tokens or classes), or over their items (a regression's float targets)
        count = inputs.pop("num_items_in_batch", None)
        labels = inputs.get("labels")
        counted = count is not None and labels is not None and not labels.is_floating_point()
        per_part = self.rows_per_micro_batch
        parts = split_rows(inputs, self.micro_batches, rows_per_part=per_part)
        if per_part is not None:  # each part a batch of one process, its loss its own mean (the class docstring)
            items, total = [batch_rows(part) for part in parts], None
        else:
            items = [labelled_items(part, self.shifts_labels) for part in parts]
            total = float(count) if counted else None
        outputs = self._run(parts, device)
        output = merge_outputs(outputs, items, total) if outputs is not None else None
        tensors = {k: v for k, v in output.items() if torch.is_tensor(v)} if output is not None else {}
        described = [(type(output), list(tensors), [(v.dtype, tuple(v.shape)) for v in tensors.values()])]
        dist.broadcast_object_list(described, src=last, group=stages.group)  # names and shapes: a few hundred bytes
        cls, names, shapes = described[0]
        if output is None:
            # zeros of the last stage's shapes; unless the last stage's values are broadcast into them, one zero
            # expanded (no memory: `Trainer` gathers the logits only when it keeps them, and the layout's gather
            # keeps the last stage's)
            made = (
                torch.zeros(shape, dtype=dtype, device=device)
                if self.everywhere
                else torch.zeros((), dtype=dtype, device=device).expand(shape)
                for dtype, shape in shapes
            )
            tensors = dict(zip(names, made, strict=True))
        if self.everywhere:
            for tensor in tensors.values():
                dist.broadcast(tensor.contiguous() if output is not None else tensor, src=last, group=stages.group)
        return output if output is not None else cls(**tensors)

    def new_evaluation(self) -> None:
        """An evaluation begins: the shared head's rows are sent again before its first use (the weights may have
        been trained since)."""
        self._head_current = False

    def _run(self, parts: list[dict[str, Any]], device: torch.device) -> list[Any] | None:
        """The stages' forward of `parts`; with the output projection shared by the stages (`split_head`), when only
        the loss is kept (`loss_only`) and the parts carry labels, each part's loss comes from the shares (and the
        output has no logits). Where the logits are kept, the projection runs whole on the last stage: sending each
        share's logits there (67 MB a micro-batch of 8 x 128 tokens at this vocabulary) made a 2-stage evaluation
        with run_clm.py's token accuracy 1.35x one process, against 1.48x with the projection on the last stage."""
        head = self.split_head if self.loss_only and "labels" in parts[0] else None
        if head is None:
            return self.stage_forward.run(parts)
        if not self._head_current:
            head.refresh(device)
            self._head_current = True
        labels = [part.pop("labels") for part in parts]
        outputs = self.stage_forward.run(parts, head, labels)
        if outputs is None:
            return None
        return [
            type(output)(loss=loss, **{k: v for k, v in output.items() if k not in ("loss", "logits")})
            for output, loss in zip(outputs, head.losses, strict=True)
        ]


# micro-batches in flight a batch is split into by default, per stage: with m micro-batches, s stages are busy
# m / (m + s - 1) of the time (a batch with fewer rows is split into single rows)
MICRO_BATCHES_PER_STAGE = 4


def forward_through_stages(
    model: nn.Module,
    cut: StageCut,
    hold: StageHold,
    precision: str,
    *,
    micro_batches: int | None = None,
    shifts_labels: bool = False,
    everywhere: bool = False,
) -> PipelinedForward:
    """The forward of a model whose stages run on separate processes, this process holding one (`hold`): every batch
    goes through the replica's stages as `micro_batches` micro-batches (`MICRO_BATCHES_PER_STAGE` a stage by default),
    several in flight; see `PipelinedForward` for `shifts_labels` and `everywhere`."""
    counts = [len(r) for r in hold.ranges]
    stage = StageForward(model, cut, counts, hold.stage, hold.mesh.get_group("pp"), precision, gate=hold.gate)
    micro_batches = micro_batches or MICRO_BATCHES_PER_STAGE * len(counts)
    return PipelinedForward(stage, model, micro_batches, shifts_labels=shifts_labels, everywhere=everywhere)


def batch_rows(batch: dict[str, Any]) -> int:
    """The rows of a batch: the first dimension of its first tensor that has one."""
    return next(v.shape[0] for v in batch.values() if torch.is_tensor(v) and v.dim())


def labelled_items(batch: dict[str, Any], shifts_labels: bool) -> int:
    """The items a micro-batch's mean loss averages: its labelled tokens (shifted for a causal LM, `shifts_labels`),
    else its rows (a class, a regression target, answer positions)."""
    labels = batch.get("labels")
    if labels is None or labels.is_floating_point():
        return batch_rows(batch)
    labels = labels[..., 1:] if shifts_labels and labels.dim() > 1 else labels
    return int(labels.ne(-100).sum())


def split_rows(batch: dict[str, Any], parts: int, rows_per_part: int | None = None) -> list[dict[str, Any]]:
    """`batch` as up to `parts` micro-batches of consecutive rows (as many as it has rows, when fewer), or, with
    `rows_per_part`, as micro-batches of that many rows (the last shorter); tensors whose first dimension is not the
    batch's rows go to every micro-batch whole."""
    rows = batch_rows(batch)
    if rows_per_part is not None:
        bounds = list(range(rows_per_part, rows, rows_per_part))  # where each part after the first starts
        parts = len(bounds) + 1
    else:
        parts = max(1, min(parts, rows))
        bounds = parts
    split = {
        k: torch.tensor_split(v, bounds) for k, v in batch.items() if torch.is_tensor(v) and v.dim() and len(v) == rows
    }
    return [{k: split[k][i] if k in split else v for k, v in batch.items()} for i in range(parts)]


def merge_outputs(outputs: list[Any], items: list[int], total: float | None = None) -> Any:
    """The model output of a batch from those of its micro-batches: tensors (and tuples of tensors: hidden states,
    attentions) concatenated along the rows; 0-dim values (the loss: each micro-batch's mean over its `items`) summed
    as means times items, over `total` (the batch's items as the caller counts them) or over the items' sum; anything
    else (a KV cache) left out."""
    if len(outputs) == 1 and total is None:
        return outputs[0]
    weights = torch.tensor(items, dtype=torch.float32)
    merged = {}
    for key, value in outputs[0].items():
        values = [output[key] for output in outputs]
        if torch.is_tensor(value) and value.dim() == 0:
            stacked = torch.stack([v.float() for v in values])
            w = weights.to(stacked.device)
            kept = w > 0  # a micro-batch without a labelled item adds nothing (its mean is 0/0)
            summed = (stacked[kept] * w[kept]).sum()
            merged[key] = (summed / (total if total is not None else w[kept].sum())).to(value.dtype)
        elif torch.is_tensor(value):
            merged[key] = torch.cat(values)
        elif isinstance(value, tuple) and value and all(torch.is_tensor(v) for v in value):
            merged[key] = tuple(torch.cat(parts) for parts in zip(*values, strict=True))
    return type(outputs[0])(**merged)
