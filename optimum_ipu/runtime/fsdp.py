"""Full parameter sharding over the data-parallel replicas (FSDP2, `torch.distributed.fsdp.fully_shard`).

Each replica keeps `1 / replicas` of every parameter, gradient and optimizer state. A layer's parameters are
all-gathered just before its forward (and again for its backward) and freed after; gradients are
reduce-scattered, so each replica averages only its own shard. The numbers are those of data parallelism.

`transformers.Trainer` refuses `--fsdp` on CPUs ("Using fsdp only works in distributed training": accelerate's
FSDP plugin wants a GPU), while `fully_shard` itself runs on gloo: so `IPUTrainer` shards the model here, on any
device, and keeps accelerate from wrapping it in DDP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ..topology import check_processes
from .stages.cut import StageCut
from .stages.hold import StageHold, hold_stage, stage_hold

FSDP_HELP = "full parameter sharding (--fsdp) needs several processes (torchrun)"


class ShardedModel(nn.Module):
    """Holds a model whose parameters `fully_shard` has sharded: `Trainer` then sees a wrapped model and leaves
    it to us (accelerate would otherwise put DDP around DTensor parameters)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def shard_model(model: nn.Module, layer_paths: Iterable[str], mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard `model` in place over every process of the job, one FSDP unit per pipeline layer plus the root
    (embeddings, heads), so at most one layer's parameters are whole at a time.

    Args:
        model (`nn.Module`): the stock model, already on this process's device.
        layer_paths (`Iterable[str]`): dotted paths of its layers (`PipelinedModel.layer_paths()`).
        mesh (`DeviceMesh`, *optional*): the replicas' 1-D mesh (the layout's `mesh["dp"]`); every process by default.

    Returns:
        `nn.Module`: the same model, its parameters now `DTensor` shards.
    """
    if not dist.is_initialized():
        raise RuntimeError(FSDP_HELP + "; no process group is initialized")
    for path in layer_paths:
        fully_shard(model.get_submodule(path), mesh=mesh)
    # Tied embeddings and output projection share one parameter: both stay in the root unit.
    fully_shard(model, mesh=mesh)
    return model


def sync_gradients_at(model: nn.Module, last_micro_batch: bool) -> None:
    """A model sharded by `shard_model` reduce-scatters its gradients in the backward of an optimizer step's last
    micro-batch only: the earlier ones accumulate unsharded (less traffic, as DDP's `no_sync`; the unsharded
    gradients are held meanwhile). Nothing for any other model (stages apart: `PipelineEngine` does it per step)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(last_micro_batch)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole, unsharded `state_dict` of a sharded model, on the CPU of rank 0 (empty on the others).

    A collective: every process must call it. Its keys and values are those of the stock model, so what is
    saved from it loads in one process. With stages on separate processes (`shard_stages`), each entry comes from
    the stage that holds (and trains) it.
    """
    shards = stage_hold(model)
    if shards is not None:
        return _gather_stages(model, shards)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def load_full_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], partial: bool = False) -> None:
    """Load a whole `state_dict` (a one-process checkpoint) into a sharded model: each process keeps its shards.
    `partial`: the state of some parameters only (peft's adapters), the others kept as they are.

    Raises:
        ValueError: the checkpoint has keys the model lacks, or lacks keys other than tied duplicates (unless
            `partial`).
    """
    shards = stage_hold(model)
    if shards is not None:
        return _load_stage(model, state_dict, shards, partial)
    options = StateDictOptions(full_state_dict=True, strict=False)
    result = set_model_state_dict(model, state_dict, options=options)
    # A tied parameter (output projection = embeddings) is saved once, under one of its names.
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing = [k for k in result.missing_keys if k not in tied and not partial]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"the checkpoint does not fit the model: missing {missing}, unexpected {result.unexpected_keys}"
        )


def _parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    # torch.optim numbers parameters in the order of its groups; torch.distributed.checkpoint names them.
    names = {p: n for n, p in model.named_parameters()}
    return [names[p] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole optimizer state of a sharded model on rank 0, in the layout of `optimizer.state_dict()` in one
    process (parameters numbered in group order), so that a one-process run resumes from it. A collective.

    A model held stage by stage writes its state per stage instead, never gathered (`stages.optimizer`)."""
    if stage_hold(model) is not None:
        raise ValueError(
            "a model held stage by stage saves its optimizer state per stage: stages.optimizer.save_stage_optimizer"
        )
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, flatten_optimizer_state_dict=False)
    full = get_optimizer_state_dict(model, optimizer, options=options)
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    return {
        "state": {index[name]: value for name, value in full.get("state", {}).items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full.get("param_groups", [])],
    }


def load_full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a one-process `optimizer.state_dict()` (or `full_optimizer_state_dict`'s) into the optimizer of a
    sharded model: each process keeps its shards of the state."""
    shards = stage_hold(model)
    if shards is not None:
        return _load_stage_optimizer(model, optimizer, state, shards)
    names = _parameter_names(model, optimizer)
    full = {
        "state": {names[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


def local_parameter_bytes(parameters: Iterable[torch.Tensor]) -> int:
    """Bytes of parameters this process holds (its shard of each `DTensor`, all of a plain tensor, none of a tensor
    on the meta device: another stage's)."""
    total = 0
    for p in parameters:
        local = p.to_local() if isinstance(p, DTensor) else p
        if local.is_meta:
            continue
        total += local.numel() * local.element_size()
    return total


# ------------------------------------------------------------------ stages on processes x sharded replicas
# A 2-D mesh (replicas x stages, dims "dp" x "pp"; rank = replica x stages + stage), composed in torchtitan's order:
# the pipeline split first (each process keeps only its stage's layers), then FSDP over the stage's replicas.


def stage_mesh(replicas: int, stages: int, device: torch.device, tensor_parallel: int = 1) -> DeviceMesh:
    """The (replicas, stages) mesh of a process pipeline, dims named `("dp", "pp")`: `mesh["pp"]` joins the
    stages of one replica (activations travel there), `mesh["dp"]` the replicas of one stage (gradients). With
    `tensor_parallel` > 1, a third, innermost dim `"tp"`: the processes that share each stage's layers (rank =
    (replica x stages + stage) x tensor_parallel + share)."""
    if tensor_parallel > 1:
        shape, names = (replicas, stages, tensor_parallel), ("dp", "pp", "tp")
        return init_device_mesh(device.type, shape, mesh_dim_names=names)
    return init_device_mesh(device.type, (replicas, stages), mesh_dim_names=("dp", "pp"))


class StageRoot(nn.Module):
    """The FSDP root of one stage: it holds the model and runs `fn(*args)` for each stage forward. A stage ends by an
    exception inside the model's forward (`stages.cut`), which the model cannot be the root of: FSDP's root
    post-forward would never run. This root's forward encloses the stage and returns."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.running = False  # inside a stage's forward: the model may run

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        was_running, self.running = self.running, True  # a stage run inside generate(), which opened it already
        try:
            output = fn(*args)
        finally:
            self.running = was_running
        # FSDP hooks its backward onto these outputs, which an in-place op on a view would drop (FSDP warns): a view
        # (the loss reshaped, an activation sent on unchanged) is returned as a copy of its own
        if isinstance(output, tuple):
            return tuple(_own(t) for t in output)
        return _own(output)


def _own(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone() if tensor._base is not None else tensor


def shard_stages(model: nn.Module, cut: StageCut, counts: Sequence[int], mesh: DeviceMesh) -> StageHold:
    """Keep only this process's stage of `model` and shard it over the stage's replicas (FSDP2), in place.

    What the stage does not run is freed first (`stages.hold.hold_stage`; a model loaded stage-local by
    `models.stage_loading.load_stage` holds its stage only already). Then each own layer is an FSDP unit over
    `mesh["dp"]`, and a `StageRoot` holds the rest (embeddings, heads: whatever this stage holds of them).

    Args:
        model (`nn.Module`): the stock model, on this process's device.
        cut (`StageCut`): its layers, embeddings and encoder-decoder split.
        counts (`Sequence[int]`): the layers of each stage, wildcards resolved.
        mesh (`DeviceMesh`): the `("dp", "pp")` mesh (`stage_mesh`).

    Returns:
        `StageHold`: what this process holds (also found later by `stage_hold(model)`).
    """
    hold = hold_stage(model, cut, counts, mesh)
    if hold.sharded:
        return hold
    for i in hold.ranges[hold.stage]:
        fully_shard(model.get_submodule(hold.layer_paths[i]), mesh=hold.mesh["dp"])
    root = StageRoot(model)
    fully_shard(root, mesh=hold.mesh["dp"], ignored_params={p for p in model.parameters() if p.is_meta})
    hold.gate, hold.sharded = root, True
    return hold


def _canonical_names(model: nn.Module) -> dict[str, str]:
    """Every parameter name (tied duplicates too) -> the name `named_parameters()` gives it."""
    first = {id(p): n for n, p in model.named_parameters()}
    return {n: first[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}


def _gather_stages(model: nn.Module, shards: StageHold) -> dict[str, torch.Tensor]:
    """Each stage's current entries, whole (gathered over its replicas), then gathered over the stages onto global
    rank 0 (replica 0, stage 0), in the order of `model.state_dict()`. A collective.

    A layer's entries come from its stage; an entry held by several stages (a tied embedding) from the stage that
    trains it, or, before the first step, from the first stage that holds it."""
    _reshard(shards)
    canonical, stage = _canonical_names(model), shards.stage
    entries = model.state_dict()
    mine = {}
    for key, value in entries.items():
        owner = shards.stage_of(canonical.get(key, key))
        held = not (value.to_local() if isinstance(value, DTensor) else value).is_meta
        if held and owner in (None, stage):
            mine[key] = (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()
    if shards.mesh.get_local_rank("dp") != 0:
        return {}
    parts: list[Any] | None = [None] * shards.mesh["pp"].size() if stage == 0 else None
    dist.gather_object(mine, parts, group=shards.mesh.get_group("pp"), group_dst=0)
    if parts is None:
        return {}
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        for key, value in part.items():
            merged.setdefault(key, value)
    return {key: merged[key] for key in entries if key in merged}


def shard_pipeline(
    model: nn.Module,
    cut: StageCut,
    counts: Sequence[int],
    ipu_config: Any,
    device: torch.device,
    mesh: DeviceMesh | None = None,
) -> StageHold:
    """`shard_stages` on the (replicas, stages) mesh of `ipu_config` (an `IPUConfig`) over this job's processes.

    Args:
        model (`nn.Module`): the stock model, whole, on this process's device.
        cut (`StageCut`): its layers, embeddings and encoder-decoder split (`PipelinedModel.stage_cut()`).
        counts (`Sequence[int]`): the layers of each stage, wildcards resolved.
        ipu_config (`IPUConfig`): its `replication_factor` (the processes must be replicas x stages).
        device (`torch.device`): this process's device.
        mesh (`DeviceMesh`, *optional*): the layout's `("dp", "pp")` mesh; the held stage's, or a new one, by default.
    """
    check_processes(ipu_config, dist.get_world_size())
    hold = stage_hold(model)
    if mesh is None:
        mesh = (
            hold.mesh if hold is not None else stage_mesh(ipu_config.value("replication_factor"), len(counts), device)
        )
    return shard_stages(model, cut, counts, mesh)


def whole_on_cpu(value: Any) -> Any:
    """A state value, whole and on the CPU (a `DTensor` is gathered over its replicas: a collective)."""
    if isinstance(value, DTensor):
        value = value.full_tensor()
    return value.detach().cpu() if torch.is_tensor(value) else value


def held_like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`full` (a whole tensor of `param`'s shape) as this process holds `param`: its shard of a `DTensor`."""
    full = full.to(device=param.device)
    if isinstance(param, DTensor):  # every process has the whole tensor: each takes its shard, nothing is sent
        return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    return full


def _load_stage(
    model: nn.Module, state_dict: dict[str, torch.Tensor], shards: StageHold, partial: bool = False
) -> None:
    """Copy into this stage's parameters and buffers (their shards) the entries of a whole `state_dict` (`partial`:
    of some parameters only, the others kept)."""
    aliases: dict[str, list[str]] = {}
    for name, first in _canonical_names(model).items():
        aliases.setdefault(first, []).append(name)
    known = set(aliases) | set(_canonical_names(model)) | {n for n, _ in model.named_buffers()}
    unexpected = [k for k in state_dict if k not in known]
    missing = []
    _reshard(shards)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in shards.freed:
                continue
            key = next((a for a in aliases[name] if a in state_dict), None)
            if key is None:
                missing.append(name)
                continue
            value = held_like(state_dict[key].to(param.dtype), param)
            target = param.to_local() if isinstance(param, DTensor) else param
            target.copy_(value.to_local() if isinstance(value, DTensor) else value)
        for name, buffer in model.named_buffers():
            if not buffer.is_meta and name in state_dict:
                buffer.copy_(state_dict[name])
    if (missing and not partial) or unexpected:
        raise ValueError(f"the checkpoint does not fit the model: missing {missing}, unexpected {unexpected}")


def reshard(model: nn.Module) -> None:
    """Put the sharded parameters of a model whose stages are sharded (`shard_stages`) back in place of the whole ones
    an evaluation gathered (FSDP keeps its root's gathered after a forward without backward)."""
    hold = stage_hold(model)
    if hold is not None:
        _reshard(hold)


def _reshard(shards: StageHold) -> None:
    if not shards.sharded:
        return
    for module in shards.gate.modules():
        if isinstance(module, FSDPModule):
            module.reshard()  # between steps they are sharded already; an evaluation may have gathered them


def _group_layout(model: nn.Module, optimizer: torch.optim.Optimizer, shards: StageHold) -> list[list[str]]:
    """The parameter names of each optimizer group as one process holding every stage numbers them: each stage's
    names (gathered over the stages, a collective), in the model's order. The groups are `Trainer`'s (weight decay
    or not), so a stage has the same groups as the others, with fewer parameters."""
    names = {p: n for n, p in model.named_parameters()}
    mine = [[names[p] for p in group["params"]] for group in optimizer.param_groups]
    parts: list[Any] = [None] * shards.mesh["pp"].size()
    dist.all_gather_object(parts, mine, group=shards.mesh.get_group("pp"))
    if len({len(part) for part in parts}) > 1:
        raise ValueError(
            f"the stages' optimizers have different numbers of parameter groups: {[len(p) for p in parts]}"
        )
    order = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    return [sorted({n for part in parts for n in part[g]}, key=order.__getitem__) for g in range(len(mine))]


def _load_stage_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], shards: StageHold
) -> None:
    """Load a one-process optimizer state: each process takes its stage's parameters, its shard of each."""
    layout = _group_layout(model, optimizer, shards)
    names = [n for group in layout for n in group]
    if [len(g) for g in layout] != [len(g["params"]) for g in state["param_groups"]]:
        raise ValueError(
            f"the optimizer state does not fit the model: groups of {[len(g['params']) for g in state['param_groups']]}"
            f" parameters, the model's optimizer has {[len(g) for g in layout]}"
        )
    params = dict(model.named_parameters())
    held = {p for group in optimizer.param_groups for p in group["params"]}
    for i, values in state["state"].items():
        param = params[names[int(i)]]
        if param in held:
            optimizer.state[param] = {
                k: held_like(v, param) if torch.is_tensor(v) and v.shape == param.shape else v
                for k, v in values.items()
            }
    for group, saved in zip(optimizer.param_groups, state["param_groups"], strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})
