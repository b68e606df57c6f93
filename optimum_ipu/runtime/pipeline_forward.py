"""Forward-only pipeline over processes: evaluation and prediction batches through the stages of one replica.

Each process runs its `StageModule` (the stock forward cut to its stage) on the batch it was given; stage i sends
its activations to stage i + 1, and the last stage returns the model's output. Nothing else travels, so no process
holds more than its stage.

Ours, not a `torch.distributed.pipelining` schedule's `eval`: its stages infer the activations' shapes once, at the
first step, while evaluation batches change shape (the last, smaller batch; sequence buckets). Here each send carries
its shapes first (one small object message), so every batch may have its own.

`StageGeneration` runs `transformers`' own `generate()` on every process of a replica: each model call of the
decoding loop goes through the stages, and the last stage's logits are broadcast to the others, so every process picks
the same tokens; each process's KV cache holds the keys and values of its own layers only.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..errors import IncompatibleIPUConfigError
from .stage_cut import StageCut, StageModule, stage_ranges
from .stage_hold import StageHold


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


class StageGeneration:
    """`generate()` of a model whose stages run on separate processes (see the module docstring).

    Every process of the replica calls the stock model's `generate()` with the same arguments inside `generating()`.
    Each call of the model that the decoding loop makes (prefill, then one per token) runs this process's stage on
    its own KV cache (the cache object `generate()` made here; its layers of other stages hold placeholders that keep
    its lengths, `stage_cut._hold_place`); the hidden states travel to the next stage and the last stage's logits come
    back to every stage. The loop then sees the same logits everywhere and, with the same random state (shared from
    the last stage as generation starts), draws the same tokens: greedy, beam search and sampling alike. Only
    activations and logits travel; a process never holds another stage's weights or cache.

    Args:
        model (`nn.Module`): the stock model, holding its stage only (`stage_hold.stage_hold(model)`).
        cut (`StageCut`): its layers, embeddings and encoder-decoder split.
        hold (`StageHold`): what this process holds: its stage, the replica's stage group and the layout.
    """

    def __init__(self, model: nn.Module, cut: StageCut, hold: StageHold) -> None:
        if hold.sharded:
            raise IncompatibleIPUConfigError(
                "generate() with stages sharded over replicas (FSDP) is not supported: load the model for generation "
                "without sharding (optimum_ipu.AutoModelForCausalLM.from_pretrained(..., ipu_config=...))"
            )
        if cut.encoder is not None:
            raise IncompatibleIPUConfigError(
                f"generate() with the stages of {type(model).__name__} on separate processes: only decoder-only "
                "models generate across processes yet; generate with an encoder-decoder model in one process"
            )
        counts = [len(r) for r in hold.ranges]
        self.model, self.gate = model, hold.gate
        self.stages = StageForward(model, cut, counts, hold.stage, hold.mesh.get_group("pp"))  # gate: generating()
        self._inside = False

    @contextmanager
    def generating(self) -> Iterator[None]:
        """While open, a call of the model runs it as described in the class docstring; `generate()` is called
        inside. The model's `forward` is wrapped on this instance for the time of the call (as accelerate's hooks
        wrap it): no class or module of `transformers` is changed."""
        model = self.model
        stock = type(model).forward.__get__(model)  # the class's forward, bound (a wrapper would call itself)

        @functools.wraps(stock)
        def forward(*args: Any, **inputs: Any) -> Any:
            if self._inside:  # the stage's own run of the stock forward (StageModule)
                return stock(*args, **inputs)
            if args:
                raise TypeError("generation across stages calls the model with keyword arguments only")
            return self._step(inputs)

        was_open = self.gate.running
        model.forward = forward
        self.gate.running = True  # the model runs its stage only: its whole forward is replaced meanwhile
        try:
            self._share_random_state()
            yield
        finally:
            del model.forward
            self.gate.running = was_open

    def _step(self, inputs: dict[str, Any]) -> Any:
        """One model call of the decoding loop: this stage's forward, then the last stage's logits everywhere."""
        stages = self.stages
        self._inside = True
        try:
            output = stages(inputs)
        finally:
            self._inside = False
        last = stages._rank(stages.num_stages - 1)
        logits = output.logits if output is not None else None
        header = [(tuple(logits.shape), logits.dtype) if logits is not None else None]
        dist.broadcast_object_list(header, src=last, group=stages.group)
        if logits is None:
            device = next(v.device for v in inputs.values() if torch.is_tensor(v))
            shape, dtype = header[0]
            logits = torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(logits.contiguous() if output is not None else logits, src=last, group=stages.group)
        if output is not None:
            return output
        return CausalLMOutputWithPast(logits=logits, cache=inputs.get("cache"))

    def _share_random_state(self) -> None:
        """Every stage takes the last stage's random state (CPU, and this process's GPU): sampling then draws the
        same tokens on every process, whatever each process consumed before."""
        stages = self.stages
        device = next((p.device for p in self.model.parameters() if not p.is_meta), torch.device("cpu"))
        states = [torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None]
        dist.broadcast_object_list(states, src=stages._rank(stages.num_stages - 1), group=stages.group)
        torch.set_rng_state(states[0])
        if states[1] is not None:
            torch.cuda.set_rng_state(states[1], device)
