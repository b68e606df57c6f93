"""Forward-only pipeline over processes: evaluation and prediction batches through the stages of one replica.

Each process runs its `StageModule` (the stock forward cut to its stage) on the batch it was given; stage i sends
its activations to stage i + 1, and the last stage returns the model's output. Nothing else travels, so no process
holds more than its stage.

Ours, not a `torch.distributed.pipelining` schedule's `eval`: its stages infer the activations' shapes once, at the
first step, while evaluation batches change shape (the last, smaller batch; sequence buckets). Here each send carries
its shapes first (one small object message), so every batch may have its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .stage_cut import StageCut, StageModule, stage_ranges


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
    ) -> None:
        self.stage, self.num_stages, self.group = stage, len(counts), group
        layers = stage_ranges(counts)[stage]
        self.module = StageModule(model, cut, layers, stage, len(counts), ["?"], precision, _nothing, root=gate)

    def _rank(self, stage: int) -> int:
        return dist.get_global_rank(self.group, stage)

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor]) -> Any:
        """This stage's part of `batch`'s forward: the model's output on the last stage, `None` on the others."""
        module = self.module
        module.keys = [next(iter(batch))]  # stage 0 finds its micro-batch by its first tensor
        module.reset([batch])
        if self.stage == 0:
            received: tuple[torch.Tensor, ...] = (batch[module.keys[0]],)
        else:
            received = self._receive(next(v for v in batch.values() if torch.is_tensor(v)).device)
        sent = module(*received)
        if self.stage == self.num_stages - 1:
            return module.last_output
        self._send(sent if isinstance(sent, tuple) else (sent,))
        return None

    def _send(self, tensors: tuple[torch.Tensor, ...]) -> None:
        dst = self._rank(self.stage + 1)
        dist.send_object_list([[(t.shape, t.dtype) for t in tensors]], dst=dst, group=self.group)
        for tensor in tensors:
            dist.send(tensor.contiguous(), dst=dst, group=self.group)

    def _receive(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        src = self._rank(self.stage - 1)
        meta: list[Any] = [None]
        dist.recv_object_list(meta, src=src, group=self.group)
        tensors = []
        for shape, dtype in meta[0]:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(tensor, src=src, group=self.group)
            tensors.append(tensor)
        return tuple(tensors)


class PipelinedForward(nn.Module):
    """The model as `transformers.Trainer`'s evaluation sees it when its stages run on separate processes: called
    with a batch (the same batch on every stage of a replica), it runs the batch through the stages (`StageForward`)
    and returns the model's output on every process of the replica (sent from the last stage), so `Trainer`'s
    `prediction_step` and metrics run unchanged.

    Args:
        stage_forward (`StageForward`): this process's stage.
        model (`nn.Module`): the stock model (registered, so `eval()` reaches it).
    """

    def __init__(self, stage_forward: StageForward, model: nn.Module) -> None:
        super().__init__()
        self.stage_forward, self.model = stage_forward, model

    def forward(self, **inputs: Any) -> Any:
        stages = self.stage_forward
        output = stages(inputs)
        payload = [None]
        if output is not None:  # the last stage: its output, on the CPU, for the other stages
            payload = [type(output)(**{k: v.cpu() if torch.is_tensor(v) else v for k, v in output.items()})]
        dist.broadcast_object_list(payload, src=stages._rank(stages.num_stages - 1), group=stages.group)
        if output is not None:
            return output
        device = next(v.device for v in inputs.values() if torch.is_tensor(v))
        received = payload[0]
        return type(received)(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in received.items()})
