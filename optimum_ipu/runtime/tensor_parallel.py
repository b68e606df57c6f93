"""Tensor parallelism: each layer's matrices split over the devices of one stage (`tensor_parallel_size`, the mesh's
innermost axis `tp`), through `torch.distributed.tensor.parallel`, on the unmodified `transformers` model.

The split is Megatron's, as torchtitan applies it: in each layer the projections that open a block (attention's
query/key/value, the MLP's up and gate) are column-wise (each device computes its share of the heads or of the
intermediate features, nothing exchanged), the ones that close it (attention's output, the MLP's down) row-wise (each
device's partial product, summed by one all-reduce). Two all-reduces a layer in the forward, two in the backward;
every other parameter (norms, position embeddings, a classifier) is replicated and sees the same activations on every
device. The vocabulary embedding is split by rows (each device looks up the ids of its share of the vocabulary, one
all-reduce) and the output projection by its vocabulary rows too, its logits gathered whole for the model's own loss:
the split fields of Optimum Graphcore (`serialized_embedding_splits_per_ipu`, `serialized_projection_splits_per_ipu`)
made real over devices.

What is split is a `TensorParallelPlan`: module paths of the model and their style, resolved by `optimum_ipu.models`
from the family's `StagePlan` (this package never reads a plan).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module
from torch.distributed.tensor.placement_types import _StridedShard
from transformers.pytorch_utils import Conv1D

from ..errors import IncompatibleIPUConfigError

logger = logging.getLogger(__name__)

LOCALIZED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # modules split into plain shares (`local_shards`)
STYLES = ("colwise", "colwise_qkv", "rowwise", "vocabulary_embedding", "vocabulary_head")


@dataclass(frozen=True)
class TensorParallelPlan:
    """What tensor parallelism splits in one model, as full module paths of that model.

    Args:
        styles (`Mapping[str, str]`): module paths -> `"colwise"` (output features split), `"colwise_qkv"` (a fused
            query|key|value projection, each of the three split: GPT-2's `c_attn`), `"rowwise"` (input features
            split, outputs summed), `"vocabulary_embedding"` (an `nn.Embedding` split by rows) or
            `"vocabulary_head"` (the output projection split by vocabulary rows, its logits gathered whole).
        divided (`tuple[str, ...]`): `"module_path.attribute"`: integer attributes that count what each device
            now holds a share of (T5's `n_heads`, read where the module builds a tensor per head), divided by the size.
        counts (`Mapping[str, int]`): what must divide by the size, by the config field that holds it
            (`num_attention_heads`, `vocab_size`, ...), for one-line errors before anything is split.
        model_name (`str`): the model's class name, as errors name it.
    """

    styles: Mapping[str, str]
    divided: tuple[str, ...] = ()
    counts: Mapping[str, int] = field(default_factory=dict)
    model_name: str = "the model"

    def __post_init__(self) -> None:
        unknown = {k: v for k, v in self.styles.items() if v not in STYLES}
        if unknown:
            raise ValueError(f"TensorParallelPlan: styles {unknown}; expected one of {STYLES}")


def check_divisible(plan: TensorParallelPlan, size: int) -> None:
    """Refuse, in one line, a `tensor_parallel_size` that does not divide a count the split shares out.

    Raises:
        IncompatibleIPUConfigError: naming the config field, its value and the sizes that would fit.
    """
    for name, count in plan.counts.items():
        if count % size:
            fits = [d for d in range(1, count + 1) if count % d == 0 and d <= 64]
            pad = (
                f", or pad the vocabulary: model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of={size})"
                if name == "vocab_size"
                else ""
            )
            raise IncompatibleIPUConfigError(
                f"`tensor_parallel_size` {size}: {plan.model_name} has {name}={count}, which does not split evenly "
                f"over {size} devices; use a size among {fits}{pad}"
            )


class Colwise(ColwiseParallel):
    """`ColwiseParallel` that also splits `transformers`' `Conv1D` (GPT-2's: its weight is stored `(in, out)`). With
    `parts` > 1 the output is `parts` projections side by side (GPT-2's `c_attn`: query | key | value) and each is split
    alike (`_StridedShard`), so that a device holds its heads of all three, `[q_i | k_i | v_i]`, and the whole tensor
    (a checkpoint, a gradient norm) is the stock one."""

    def __init__(self, parts: int = 1) -> None:
        super().__init__()
        self.parts = parts

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not isinstance(module, Conv1D):
            return super()._apply(module, device_mesh)
        output = functools.partial(self._prepare_output_fn, self.output_layouts, self.use_local_output)
        if self.parts > 1:  # the share is the device's [q_i | k_i | v_i] as it is: no redistribution
            output = _local_output
        inputs = functools.partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts)
        return distribute_module(module, device_mesh, self._partition_conv1d_fn, inputs, output)

    def _partition_conv1d_fn(self, name: str, module: nn.Module, device_mesh: Any) -> None:
        def placement(param_name: str) -> Any:
            dim = 1 if param_name == "weight" else 0  # weight (in, out), bias (out,)
            return _StridedShard(dim, split_factor=self.parts) if self.parts > 1 else Shard(dim)

        _distribute_parameters(module, device_mesh, placement, self.src_data_rank)


class Rowwise(RowwiseParallel):
    """`RowwiseParallel` that also splits `transformers`' `Conv1D` (weight `(in, out)`: split by its input rows)."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not isinstance(module, Conv1D):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)
        inputs = functools.partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts)
        output = functools.partial(self._prepare_output_fn, self.output_layouts, self.use_local_output)
        return distribute_module(module, device_mesh, self._partition_conv1d_fn, inputs, output)

    def _partition_conv1d_fn(self, name: str, module: nn.Module, device_mesh: Any) -> None:
        # the weight split by its input rows; the bias added once, whole
        placement = lambda param_name: Shard(0) if param_name == "weight" else Replicate()  # noqa: E731
        _distribute_parameters(module, device_mesh, placement, self.src_data_rank)


def _distribute_parameters(
    module: nn.Module, mesh: Any, placement: Callable[[str], Any], src_data_rank: int | None
) -> None:
    """Replace each of `module`'s own parameters by a `DTensor` placed as `placement(name)` says."""
    for name, param in list(module.named_parameters(recurse=False)):
        split = distribute_tensor(param, mesh, [placement(name)], src_data_rank=src_data_rank)
        module.register_parameter(name, nn.Parameter(split, requires_grad=param.requires_grad))


def _local_output(mod: nn.Module, outputs: Any, device_mesh: Any) -> Any:
    return outputs.to_local()


def _style(kind: str) -> ParallelStyle:
    if kind == "colwise":
        return Colwise()
    if kind == "colwise_qkv":
        return Colwise(parts=3)
    if kind == "rowwise":
        return Rowwise()
    if kind == "vocabulary_embedding":  # rows of the table split; each device's lookups summed (Partial -> whole)
        return RowwiseParallel(input_layouts=Replicate())
    return ColwiseParallel(output_layouts=Replicate())  # vocabulary_head: logits gathered for the model's own loss


def parallelize(model: nn.Module, plan: TensorParallelPlan, mesh: Any) -> nn.Module:
    """Split `model`'s matrices over the 1-D mesh `mesh` (the job's `mesh["tp"]`) in place, as `plan` says.

    Every process of the mesh must hold the same weights (the same checkpoint or seed): each keeps its share of them.
    The model's forward, loss and `generate()` are unchanged for the caller: activations come back whole.

    Args:
        model (`nn.Module`): the stock model, on this process's device.
        plan (`TensorParallelPlan`): what to split (`optimum_ipu.models.tensor_parallel_plan`).
        mesh (`DeviceMesh`): the tensor-parallel devices of this stage.

    Returns:
        `nn.Module`: the same model, its split parameters now `DTensor`s.

    Raises:
        IncompatibleIPUConfigError: a count of the model does not divide by the size.
    """
    size = mesh.size()
    check_divisible(plan, size)
    aliases = _aliases(model)
    for path, kind in plan.styles.items():
        _split_module(model.get_submodule(path), path, kind, mesh)
    for entry in plan.divided:
        path, attribute = entry.rsplit(".", 1)
        module = model.get_submodule(path)
        setattr(module, attribute, getattr(module, attribute) // size)  # this device's share (heads, features)
    _retie(model, aliases)
    for param in model.parameters():
        if isinstance(param, DTensor) and param.requires_grad:  # (frozen: a LoRA's base weights)
            param.register_post_accumulate_grad_hook(_gradient_placed_as_parameter)
    logger.info("tensor parallelism over %d devices: %d modules split", size, len(plan.styles))
    return model


def _split_module(module: nn.Module, path: str, kind: str, mesh: Any) -> None:
    """Split one module of the plan; a `peft` LoRA layer wrapping it (its `base_layer`, `lora_A`, `lora_B`) is split
    around it: column-wise, `lora_B` is split as the base is (each device adds its share of the update); row-wise,
    `lora_A` takes the device's share of the input features and its rank-`r` outputs are summed (one small
    all-reduce), `lora_B` whole."""
    lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
    if not hasattr(module, "base_layer") or lora_a is None or lora_b is None:
        parallelize_module(module, mesh, _style(kind))
        return
    if kind not in ("colwise", "rowwise") or not all(
        isinstance(m, nn.Linear) for m in (*lora_a.values(), *lora_b.values())
    ):
        raise IncompatibleIPUConfigError(
            f"`tensor_parallel_size`: the LoRA adapter on {path} ({kind}) cannot be split yet; leave that module out "
            "of the LoraConfig's target_modules, or use tensor_parallel_size 1"
        )
    parallelize_module(module.base_layer, mesh, _style(kind))
    for adapter in (lora_b if kind == "colwise" else lora_a).values():
        parallelize_module(adapter, mesh, _style(kind))


def _gradient_placed_as_parameter(param: torch.Tensor) -> None:
    """Keep a split parameter's gradient split as the parameter is. The vocabulary embedding's backward returns its
    gradient replicated (the whole table's gradient on every process: 262 MB a process for 32,000 x 2,048 in fp32);
    its share is a slice of it, taken without communication."""
    if param.grad is not None and param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(placements=param.placements)


def _aliases(model: nn.Module) -> list[list[tuple[str, str]]]:
    """The parameters held under several names (a tied embedding and output projection, BERT's decoder bias and
    its head's `bias`), as `(module path, attribute)` lists."""
    names: dict[int, list[tuple[str, str]]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        module, _, attribute = name.rpartition(".")
        names.setdefault(id(param), []).append((module, attribute))
    return [group for group in names.values() if len(group) > 1]


def _retie(model: nn.Module, aliases: list[list[tuple[str, str]]]) -> None:
    """Splitting gave each split module a new parameter: where one of a tied group's names now holds a split one
    (the first, when both sides were split alike: a tied embedding and head are both split by vocabulary rows), every
    other name of the group holds it too, so that one tensor is trained, as in the stock model."""
    for group in aliases:
        held = [getattr(model.get_submodule(m), a) for m, a in group]
        split = next((p for p in held if isinstance(p, DTensor)), None)
        if split is not None:
            for module, attribute in group:
                setattr(model.get_submodule(module), attribute, split)


def inference_mesh(processes: int, size: int) -> Any:
    """The `("dp", "tp")` mesh of an inference job of `processes` processes, each replica split over `size` of them
    (`tp` innermost), on the GPUs when there are some. A collective: every process makes it."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return init_device_mesh(device, (processes // size, size), mesh_dim_names=("dp", "tp"))


def is_tensor_parallel(model: nn.Module) -> bool:
    """Whether some parameter of `model` is split by tensor parallelism (a `DTensor` over a `tp` mesh, or a plain
    share after `local_shards.localize`)."""
    if any(module in LOCALIZED for module in model.modules()):
        return True
    return any(isinstance(p, DTensor) and "tp" in (p.device_mesh.mesh_dim_names or ()) for p in model.parameters())


def _by_kind(tensors: list[torch.Tensor], placements: bool = True) -> dict[Any, list[torch.Tensor]]:
    """`tensors` grouped as torch's `_foreach` kernels take them together: plain tensors (key None), and `DTensor`s
    by mesh and (with `placements`) placements."""
    kinds: dict[Any, list[torch.Tensor]] = {}
    for tensor in tensors:
        split = isinstance(tensor, DTensor)
        key = (tensor.device_mesh, tensor.placements if placements else None) if split else None
        kinds.setdefault(key, []).append(tensor)
    return kinds


def gradient_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of `grads` that mix plain tensors and `DTensor`s of one or more meshes and placements (a split
    model's norms and matrices, FSDP's shards), which torch's `_foreach` kernels refuse to mix: each kind's norm (a
    `DTensor`'s made whole over its mesh, whatever its placement), combined. A plain tensor, on every process."""
    norms = [whole(torch.nn.utils.get_total_norm(group)) for group in _by_kind(grads).values()]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` over parameters whose gradients mix plain tensors and `DTensor`s
    (`gradient_norm`): the norm over all of them, then each kind clipped by it.

    Returns:
        `torch.Tensor`: the total norm before clipping, a plain tensor.
    """
    kinds = _by_kind(params)
    if len(kinds) == 1:  # one kind: torch's own, as ever
        return whole(torch.nn.utils.clip_grad_norm_(params, max_norm))
    total = gradient_norm([p.grad for p in params])
    for group in kinds.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def step_mixed_groups_tensor_by_tensor(optimizer: torch.optim.Optimizer) -> int:
    """Make each parameter group of `optimizer` that mixes plain tensors and `DTensor`s (or `DTensor`s of several
    meshes: a split model's classifier beside its split matrices) step tensor by tensor: torch's fused and foreach
    kernels take a group's tensors together and refuse the mix ("got mixed torch.Tensor and DTensor"):
    `run_glue.py`'s split BERT stopped there under the lowest versions we allow (transformers 5.10.1, accelerate 1.3).
    The groups stay as they are (a checkpoint's state maps onto them in any layout); the numbers are the kernels' up
    to rounding.

    Returns:
        `int`: how many groups now step tensor by tensor.
    """
    mixed = [group for group in optimizer.param_groups if len(_by_kind(group["params"], placements=False)) > 1]
    for group in mixed:
        for flag in ("fused", "foreach"):
            if flag in group:
                group[flag] = False
    return len(mixed)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole value of a possibly split tensor (a collective for a `DTensor`: every process of its mesh calls it)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
