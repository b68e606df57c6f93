"""Stage plans derived from a model's structure, for `transformers` classes that have no registered plan.

Most Hub architectures keep their transformer layers in one `nn.ModuleList` of identical layers under the base
model (`model.layers`, `encoder.layer`, `h`, `blocks`), or an encoder and a decoder list. That list is all a
plan needs: everything before the first layer runs with stage 0 and everything after the last with the last
stage, and `optimum_ipu.runtime.stages.cut` cuts the stock forward there. A derived plan declares no chunked
vocabulary loss and no packing (facts that need checking per family); `projection_serialization_factor` still
computes the logits in chunks. Its position offset follows its embeddings (RoBERTa's numbering where they share
their padding index with the position table: XLM-RoBERTa, CamemBERT, Longformer). Its layers are fused by ONNX
Runtime as BERT's when they are built as BERT's (the attention and feed-forward modules under BERT's names:
XLM-RoBERTa, ELECTRA, CamemBERT), else not at all. Its input kind follows the model's `main_input_name`. When
stages run apart, the first forward checks what a pass-through cannot stand in for (a layer run twice, state handed
between layers besides the hidden states) and refuses it clearly.

How many architectures this covers, measured over every class that `transformers` registers for four auto
classes, is in docs/model-zoo.md (`benchmarks/model_zoo.py` measures it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import IncompatibleIPUConfigError
from .stage_plan import StagePlan, no_position_offset, position_offset_after_padding

logger = logging.getLogger(__name__)

_derived: dict[str, StagePlan] = {}
# (config class, model_type) -> its models' position numbering
_position_offsets: dict[tuple[type, Any], Callable[[Any], int]] = {}


def _layer_lists(root: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """The outermost `nn.ModuleList`s under `root` whose items are all of one class (not lists themselves) and
    hold parameters."""
    found: list[tuple[str, nn.ModuleList]] = []
    for name, module in root.named_modules():
        if not isinstance(module, nn.ModuleList) or not len(module) or not name:
            continue
        if any(name.startswith(outer + ".") for outer, _ in found):
            continue  # a list inside a layer of a list already found (attention heads, experts)
        kinds = {type(item) for item in module}
        if (
            len(kinds) == 1
            and not issubclass(next(iter(kinds)), nn.ModuleList)
            and next(module[0].parameters(), None) is not None
        ):
            found.append((name, module))
    return found


def _main_list(root: nn.Module, where: str, depth: int | None = None) -> str:
    """The path (under `root`) of the layer list: the one as long as the config's layer count if there is one,
    else the one holding most parameters; a clear error if there is none, or if the layers' parts are kept in
    parallel lists (XLM: attentions, norms and feed-forwards in four lists of the same length)."""
    lists = _layer_lists(root)
    if not lists:
        raise IncompatibleIPUConfigError(
            f"{where} holds no list of identical layers, so no stage plan can be derived; register one with "
            "optimum_ipu.models.register_stage_plan(StagePlan(...)) (see docs/adding_a_family.md)"
        )

    def size(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    as_deep = [item for item in lists if depth is not None and len(item[1]) == depth]
    name, chosen = max(as_deep or lists, key=lambda item: size(item[1]))
    parent = name.rpartition(".")[0]
    siblings = [
        other
        for other, module in lists
        if other != name and other.rpartition(".")[0] == parent and len(module) == len(chosen)
    ]
    if siblings:
        raise IncompatibleIPUConfigError(
            f"{where} keeps the parts of each layer in parallel lists ({', '.join([name, *siblings])}), so no stage "
            "plan can be derived; register one with optimum_ipu.models.register_stage_plan(StagePlan(...)) "
            "(see docs/adding_a_family.md)"
        )
    return name


def _relative_path(base: nn.Module, module: nn.Module) -> str:
    for name, candidate in base.named_modules():
        if candidate is module:
            return name
    raise IncompatibleIPUConfigError(f"{type(module).__name__} is not a submodule of {type(base).__name__}")


def _input_kind(model: Any) -> str:
    """A derived plan's `input_kind`, from the model's `main_input_name` (`transformers`' own attribute):
    `input_ids` are tokens, `pixel_values` pixels, and any other main input (`input_features`, `input_values`)
    is taken for audio features."""
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        return "tokens"
    return "pixels" if name.startswith("pixel") else "audio"


def _bert_shaped(layer: Any) -> bool:
    """Whether a layer is BERT's (self-attention query/key/value, attention output, intermediate, output): the graph
    ONNX Runtime's `bert` fusions match, whatever the family calls itself (XLM-RoBERTa, ELECTRA, CamemBERT...)."""
    names = {name for name, _ in layer.named_modules()}
    return {"attention.self.query", "attention.self.key", "attention.output.dense", "intermediate.dense"} <= names


# The layouts a derived plan's tensor-parallel split recognises in a layer: attention's q/k/v and its output, and the
# feed-forward's gate/up and down or fc1 and fc2 (Llama-, BART-, OPT-like), each group under one parent module.
_ATTENTION_OPENERS, _ATTENTION_CLOSERS = ("q_proj", "k_proj", "v_proj"), ("o_proj", "out_proj")
_FEED_FORWARDS = ((("gate_proj", "up_proj"), "down_proj"), (("fc1",), "fc2"))
_HEAD_COUNTS = ("num_heads", "num_key_value_heads")  # an attention module's own counts, divided on each device


def _tensor_parallel(layers: list[nn.Module]) -> dict[str, Any]:
    """The derived plan's `tensor_parallel` fields from its first layer(s) (an encoder's and a decoder's): BERT's
    split for a BERT-shaped layer, else the common layouts (`_ATTENTION_OPENERS` ..., `_FEED_FORWARDS`); none matched,
    a reason instead (the plan then refuses `tensor_parallel_size` > 1 in one line)."""
    if all(_bert_shaped(layer) for layer in layers):
        from .families.encoders import BERT_TENSOR_PARALLEL

        return {"tensor_parallel": BERT_TENSOR_PARALLEL}
    styles: dict[str, str] = {}
    divided: list[str] = []
    for layer in layers:
        linears = {name for name, module in layer.named_modules() if isinstance(module, nn.Linear)}
        for name in linears:
            parent, _, leaf = name.rpartition(".")
            at = f"{parent}." if parent else ""
            if leaf == "q_proj" and {at + o for o in _ATTENTION_OPENERS} <= linears:
                closer = next((at + c for c in _ATTENTION_CLOSERS if at + c in linears), None)
                if closer is not None:
                    styles.update({at + o: "colwise" for o in _ATTENTION_OPENERS} | {closer: "rowwise"})
                    owner = layer.get_submodule(parent) if parent else layer
                    divided += [at + a for a in _HEAD_COUNTS if isinstance(getattr(owner, a, None), int)]
            for openers, closer in _FEED_FORWARDS:
                if leaf == openers[0] and {at + o for o in openers} | {at + closer} <= linears:
                    styles.update({at + o: "colwise" for o in openers} | {at + closer: "rowwise"})
    if not styles:
        names = ", ".join(sorted({type(layer).__name__ for layer in layers}))
        reason = f"its derived plan found none of the layouts it splits (q/k/v/o, gate/up/down, fc1/fc2) in {names}"
        return {"tensor_parallel_reason": reason}
    return {"tensor_parallel": styles, "tensor_parallel_divided": tuple(dict.fromkeys(divided))}


def _position_offset(base: nn.Module) -> Callable[[Any], int]:
    """A derived plan's `position_offset`: RoBERTa's numbering (from `pad_token_id + 1`) where the embeddings keep a
    `padding_idx` that their position table shares (RoBERTa's code, copied by XLM-RoBERTa, CamemBERT, Longformer,
    ...), else from 0."""
    embeddings = getattr(base, "embeddings", None)
    table = getattr(embeddings, "position_embeddings", None)
    if getattr(embeddings, "padding_idx", None) is not None and getattr(table, "padding_idx", None) is not None:
        return position_offset_after_padding
    return no_position_offset


def config_position_offset(config: Any) -> int:
    """The first position id of a model of a family without a registered plan, as its derived plan would say: its
    base model is built on the meta device (no memory; once per config class and model type) and read by
    `_position_offset`; 0 when `transformers` cannot build it from the config."""
    key = (type(config), getattr(config, "model_type", None))
    rule = _position_offsets.get(key)
    if rule is None:
        import transformers

        try:
            with torch.device("meta"):
                model = transformers.AutoModel.from_config(config)
            rule = _position_offset(getattr(model, "base_model", model))
        except Exception as err:  # any config transformers cannot build (unknown type, remote code): numbered from 0
            logger.debug("position offset of %s: %s; taken as 0", type(config).__name__, err)
            rule = no_position_offset
        _position_offsets[key] = rule
    return rule(config)


def derive_plan(model: Any) -> StagePlan:
    """A plan for `model`'s class from its structure (memoised per class; said once, as a warning).

    Args:
        model (`transformers.PreTrainedModel`): a model of a class without a registered plan.

    Raises:
        `IncompatibleIPUConfigError`: its base model holds no list of identical layers.
    """
    name = type(model).__name__
    if name in _derived:
        return _derived[name]
    base = getattr(model, "base_model", model)
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", name)
    get_encoder = getattr(base, "get_encoder", None)
    if getattr(config, "is_encoder_decoder", False) and callable(get_encoder) and hasattr(base, "get_decoder"):
        encoder, decoder = get_encoder(), base.get_decoder()
        encoder_path, decoder_path = _relative_path(base, encoder), _relative_path(base, decoder)
        layers = (
            f"{encoder_path}.{_main_list(encoder, f'{name} encoder', getattr(config, 'encoder_layers', None))}",
            f"{decoder_path}.{_main_list(decoder, f'{name} decoder', getattr(config, 'decoder_layers', None))}",
        )
        counts = tuple(f for f in ("encoder_layers", "decoder_layers") if hasattr(config, f)) or ("num_hidden_layers",)
        firsts = [base.get_submodule(path)[0] for path in layers]
        plan = StagePlan(
            family,
            (name,),
            (),
            layers,
            counts,
            encoder=encoder_path,
            input_kind=_input_kind(model),
            derived=True,
            **_tensor_parallel(firsts),
        )
    else:
        embeddings = tuple(child for child, _ in base.named_children() if "emb" in child)
        depth = getattr(config, "num_hidden_layers", None)
        layers = (_main_list(base, name, depth),)
        fusion = "bert" if _bert_shaped(base.get_submodule(layers[0])[0]) else None
        kind = _input_kind(model)
        plan = StagePlan(
            family,
            (name,),
            embeddings,
            layers,
            input_kind=kind,
            position_offset=_position_offset(base),
            onnx_fusion_model_type=fusion,
            derived=True,
            **_tensor_parallel([base.get_submodule(layers[0])[0]]),
        )
    logger.warning(
        "%s has no registered stage plan; derived one from its structure: pipeline layers %s. Check it with "
        "tests like tests/test_pipelined.py, or register a plan (docs/adding_a_family.md).",
        name,
        " + ".join(plan.layers),
    )
    _derived[name] = plan
    return plan
