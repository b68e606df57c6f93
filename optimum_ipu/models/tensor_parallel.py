"""The tensor-parallel plan of one model: its family's `StagePlan.tensor_parallel` resolved to module paths of that
model (each pipeline layer's, the vocabulary embedding's and the output projection's), for
`optimum_ipu.runtime.tensor_parallel.parallelize`; and the split of a model for inference under `torchrun`."""

from __future__ import annotations

from fnmatch import fnmatchcase

from torch import nn
from transformers.utils.logging import get_logger

from ..config import IPUConfig
from ..errors import IncompatibleIPUConfigError
from ..runtime.distributed import join_process_group, world_size
from ..runtime.host_collectives import HostCollectives
from ..runtime.local_shards import hook_ids, localizable, localize
from ..runtime.tensor_parallel import TensorParallelPlan, inference_mesh, parallelize
from .pipelined import PipelinedModel

logger = get_logger(__name__)


def _matching(names: list[str], prefix: str, pattern: str) -> list[str]:
    """Of `names` (a layer's module paths, relative), the full paths of those that match `pattern` level by level
    (`*`: any one level)."""
    levels = pattern.split(".")
    return [
        f"{prefix}.{name}"
        for name in names
        if len(name.split(".")) == len(levels) and all(map(fnmatchcase, name.split("."), levels))
    ]


def _vocabulary_styles(model: nn.Module) -> dict[str, str]:
    """The vocabulary embedding (with every embedding module that shares its table: T5's encoder and decoder
    `embed_tokens` beside `shared`) and the output projection (a linear over the same vocabulary), by path."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if not isinstance(embedding, nn.Embedding):
        return {}
    styles = {
        name: "vocabulary_embedding"
        for name, module in model.named_modules()
        if isinstance(module, nn.Embedding) and module.weight is embedding.weight
    }
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, nn.Linear) and head.out_features == embedding.num_embeddings:
        styles[next(name for name, module in model.named_modules() if module is head)] = "vocabulary_head"
    return styles


def tensor_parallel_plan(pipelined: PipelinedModel, size: int) -> TensorParallelPlan:
    """What `tensor_parallel_size` `size` splits in `pipelined.model`, from its family's `StagePlan`.

    Args:
        pipelined (`PipelinedModel`): the model and its plan.
        size (`int`): the tensor-parallel size (its counts are checked by `parallelize`).

    Returns:
        `TensorParallelPlan`: full module paths of `pipelined.model` and their styles.

    Raises:
        IncompatibleIPUConfigError: the (registered) family has no tensor-parallel split, or a plan entry matches no
            module of the model (a `transformers` version that renamed it). A derived plan without one runs whole
            on every process instead (said once).
    """
    plan, model = pipelined.plan, pipelined.model
    name = type(model).__name__
    refusal = plan.tensor_parallel_refusal()
    if refusal and plan.derived:  # a structure guessed, not checked: run it whole rather than refuse, and say so
        logger.warning_once(
            f"`tensor_parallel_size` {size}: {name} runs whole on each of the {size} processes of a split (the same "
            f"numbers, no memory saved): {refusal}; register a StagePlan with tensor_parallel to split it"
        )
        return TensorParallelPlan(styles={}, model_name=name)
    if refusal:
        raise IncompatibleIPUConfigError(
            f"`tensor_parallel_size` {size}: {name} cannot split its layers over devices: {refusal}; use "
            "tensor_parallel_size 1 (pipeline stages and replicas still apply)"
        )
    styles: dict[str, str] = {}
    divided: list[str] = []
    for layer in pipelined.layer_paths():
        names = [n for n, _ in model.get_submodule(layer).named_modules() if n]  # one walk of the layer
        # entries may be absent in some layers (cross attention in an encoder's, T5's position bias past block 0,
        # `wi` or `wi_0`/`wi_1`); a layer that matches none was renamed under the plan
        found = {
            path: style for pattern, style in plan.tensor_parallel.items() for path in _matching(names, layer, pattern)
        }
        if not found:
            raise IncompatibleIPUConfigError(
                f"{name}: no module of layer {layer} is named in its tensor-parallel plan "
                f"({', '.join(plan.tensor_parallel)}); this transformers version may have renamed them"
            )
        styles.update(found)
        for entry in plan.tensor_parallel_divided:
            pattern, attribute = entry.rsplit(".", 1)
            divided += [f"{path}.{attribute}" for path in _matching(names, layer, pattern)]
    vocabulary = _vocabulary_styles(model)
    styles.update(vocabulary)
    counts = {field: getattr(model.config, field, None) for field in plan.tensor_parallel_counts}
    counts = {field: value for field, value in counts.items() if isinstance(value, int) and value > 0}
    if vocabulary:
        counts["vocab_size"] = model.get_input_embeddings().num_embeddings
    return TensorParallelPlan(styles=styles, divided=tuple(divided), counts=counts, model_name=name)


def split_for_inference(model: nn.Module, ipu_config: IPUConfig) -> nn.Module:
    """Under `torchrun`, with `inference_tensor_parallel_size` > 1, split `model`'s layers over the job's processes
    (the mesh `("dp", "tp")`, `tp` innermost), for `pipeline()` and `optimum-ipu serve`: every process then runs each
    call together (the same inputs: `optimum_ipu.pipelines.processes.lockstep` in a server, or the same script), and
    each gets the whole model's outputs. In one process the shares run in turn (said once); nothing is split.

    Args:
        model (`nn.Module`): a stock model or a `PipelinedModel`, whole (the same weights in every process).
        ipu_config (`IPUConfig`): its inference layout.

    Returns:
        `nn.Module`: the same model, split in place.

    Raises:
        IncompatibleIPUConfigError: the family has no split, the processes are not a multiple of the size, or the
            inference stages are on separate processes too (not yet).
    """
    size = ipu_config.value("tensor_parallel_size", inference=True)
    processes = world_size()
    if size == 1 or processes == 1:
        if size > 1:
            logger.warning_once(
                f"inference_tensor_parallel_size {size} in one process: its shares run in turn here (the whole "
                "model, the same outputs); launch torchrun to split the layers over processes"
            )
        return model
    if ipu_config.value("ipus_per_replica", inference=True) > 1 or processes % size:
        raise IncompatibleIPUConfigError(
            f"inference_tensor_parallel_size {size} under torchrun with {processes} processes: each process must hold "
            f"a share of the whole model (inference_ipus_per_replica 1, processes a multiple of {size}); launch "
            f"torchrun --nproc_per_node {size}"
        )
    join_process_group()
    pipelined = model if isinstance(model, PipelinedModel) else PipelinedModel(model, ipu_config)
    plan, mesh = tensor_parallel_plan(pipelined, size), inference_mesh(processes, size)["tp"]
    before = hook_ids(pipelined.model, plan)
    parallelize(pipelined.model, plan, mesh)
    if localizable(pipelined.model, plan):  # plain tensors and shared-memory exchanges: decoding's few rows a step
        localize(pipelined.model, plan, before, HostCollectives(mesh.get_group()))
    return model
