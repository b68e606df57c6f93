"""The model zoo: which `transformers` architectures pipeline into 2 and 3 stages with the stock model's numbers.

Every class that `transformers` registers for `AutoModelForCausalLM`, `AutoModelForMaskedLM`,
`AutoModelForSequenceClassification` and `AutoModelForSeq2SeqLM` is built from its default config shrunk to a
tiny one (hidden 32, 4 layers or 2 + 2, 4 heads sharing 2 key/value heads unless the default has as many of
each, vocabulary 128, 64 positions, dropout off; nested text/vision/audio configs too), first on the meta
device to check its size, then with random weights. Its stock forward and backward (fp32, training mode) are
compared with `run_stages_in_turn` in 2 and 3 stages (`layers_per_ipu` `[-1, -1]` and `[-1, -1, -1]`): every
output tensor, the loss and every gradient, atol 1e-5. Each class ends in exactly one category
(`CATEGORIES`) with its reason.

Each class runs in a worker process (one at a time) with a time limit, so a hang or a crash of one class is
recorded and the sweep goes on.

    python benchmarks/model_zoo.py [--classes BertForMaskedLM,...] [--timeout 90] \
        [--output benchmarks/results/model_zoo.json]
    python benchmarks/model_zoo.py --summarize benchmarks/results/model_zoo.json   # the summary again, no run
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import multiprocessing
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

# In this order, a class listed by several (BART's ForConditionalGeneration: seq2seq and masked LM) gets the
# inputs of the first.
MAPPINGS = {
    "AutoModelForSeq2SeqLM": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
}
CATEGORIES = {
    "passes": "pipelines into 2 and 3 stages with the stock outputs, loss and gradients",
    "no_layer_list": "refused clearly: its base model holds no list of identical layers",
    "refused": "refused clearly when its stages run apart: a layer runs twice, or hands on more than hidden states",
    "unbuildable": "its config could not be shrunk, or the model could not be built or run offline",
    "mismatch": "pipelined, but an output or a gradient differs from the stock model's",
    "crashed": "pipelining raised an exception, hung or killed the process",
}
STAGES = {2: [-1, -1], 3: [-1, -1, -1]}
ATOL = 1e-5
MAX_PARAMETERS = 5_000_000  # a shrunk config above this kept some size of its default
BATCH, SEQ, TARGET_SEQ, VOCAB, LABELS = 2, 8, 5, 128, 2
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, POSITIONS = 32, 4, 2, 8, 64, 64  # grouped-query attention

# Config fields shrunk by name, wherever they occur (nested configs included): (size, field names).
SIZES: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        HIDDEN,
        (
            "hidden_size",
            "d_model",
            "n_embd",
            "dim",
            "embed_dim",
            "model_dim",
            "word_embed_proj_dim",
            "embedding_size",
            "hidden_dim",
            "input_embedding_size",
            "output_embedding_size",
            "lru_width",
            "true_hidden_size",
            "intra_bottleneck_size",
            "d_latents",
            "cross_attention_hidden_size",
            "audio_hidden_size",
            "projector_input_dim",
            "projector_output_dim",
            "backbone_hidden_size",
            "emb_dim",
            "entity_emb_size",
            "pronunciation_embed_dim",
            "shape_embed_dim",
            "xpath_unit_hidden_size",
        ),
    ),
    (
        HEADS,
        (
            "num_attention_heads",
            "n_head",
            "num_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "n_heads",
            "attention_heads",
            "index_n_heads",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "mamba_n_heads",
            "linear_num_heads",
            "swa_num_attention_heads",
        ),
    ),
    (
        KV_HEADS,
        (
            "num_key_value_heads",
            "num_kv_heads",
            "n_head_kv",
            "multi_query_group_num",
            "n_kv_heads",
            "swa_num_key_value_heads",
        ),
    ),
    (
        HEAD_DIM,
        (
            "head_dim",
            "d_kv",
            "attention_head_size",
            "attention_head_dim",
            "dim_head",
            "v_head_dim",
            "swa_head_dim",
            "index_head_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "kv_lora_rank",
            "q_lora_rank",
            "mamba_headdim",
            "rotary_dim",
            "query_pre_attn_scalar",
            "hidden_size_per_layer_input",
            "d_head",
        ),
    ),
    (
        8,
        (
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "mamba_d_state",
            "state_size",
            "time_step_rank",
            "index_topk",
            "o_lora_rank",
            "embedding_rank",
            "adapter_rank",
            "loop_gate_rank",
            "linear_head_dim",
        ),
    ),
    (
        FFN,
        (
            "intermediate_size",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "d_ff",
            "n_inner",
            "ffn_hidden_size",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "dense_intermediate_size",
            "feed_forward_size",
            "dim_ff",
            "dff",
            "mlp_dim",
            "expert_ffn_hidden_size",
            "router_hidden_size",
            "mamba_d_ssm",
            "d_inner",
        ),
    ),
    (4, ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")),
    (2, ("num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token", "zero_expert_num")),
    (1, ("n_group", "topk_group", "num_expert_group")),  # group-limited expert routing: one group
    (
        POSITIONS,
        (
            "max_position_embeddings",
            "n_positions",
            "max_source_positions",
            "max_target_positions",
            "n_ctx",
            "max_encoder_position_embeddings",
            "max_decoder_position_embeddings",
            "context_length",
        ),
    ),
    (
        VOCAB,
        (
            "vocab_size",
            "decoder_vocab_size",
            "src_vocab_size",
            "tgt_vocab_size",
            "vocab_size_per_layer_input",
            "entity_vocab_size",
            "pronunciation_vocab_size",
            "shape_vocab_size",
            "unpadded_vocab_size",
            "encoder_hash_byte_group_vocab",
        ),
    ),
)
LAYER_FIELDS = (
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "n_layers",
    "num_decoder_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
)
SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}


# ----------------------------------------------------------------------------------------- the classes
def zoo_classes() -> dict[str, dict[str, str]]:
    """Every class of the four auto mappings: `{class_name: {"model_type", "auto"}}`.

    A class listed under several model types (`LlamaForCausalLM` serves many) is built with its own family's
    config (the model type whose folder defines it), and its task is that of the first mapping listing it.
    """
    from transformers.models.auto import modeling_auto

    classes: dict[str, dict[str, str]] = {}
    for auto, mapping in MAPPINGS.items():
        for model_type, names in getattr(modeling_auto, mapping).items():
            for name in (names,) if isinstance(names, str) else names:
                own = f"models.{model_type.replace('-', '_')}.modeling_" in _module_of(name)
                if name not in classes or (own and not classes[name].get("own")):
                    auto_of = classes[name]["auto"] if name in classes else auto
                    classes[name] = {"model_type": model_type, "auto": auto_of, "own": own}
    return {name: {"model_type": i["model_type"], "auto": i["auto"]} for name, i in classes.items()}


def _module_of(class_name: str) -> str:
    """The module path that defines a `transformers` class, from the lazy module's table (imports nothing)."""
    import transformers

    return "." + getattr(transformers, "_class_to_module", {}).get(class_name, "")


# --------------------------------------------------------------------------------- shrinking configs
def _layer_count(defaults: dict[str, Any]) -> int | None:
    return next((defaults[f] for f in LAYER_FIELDS if isinstance(defaults.get(f), int)), None)


def _shrunk_value(key: str, value: Any, encoder_decoder: bool) -> Any:
    """The tiny value of one config field, or `value` itself when the field is not a size."""
    if value is None and key == "vocab_size":
        return VOCAB  # ESM leaves it to the tokenizer
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float) and ("drop" in key or key.endswith("_pdrop")):
        return 0.0
    if not isinstance(value, int):
        return value
    if key in LAYER_FIELDS:
        return 2 if encoder_decoder else 4
    for size, names in SIZES:
        if key in names:
            return size
    if key in SPECIAL_IDS and value >= VOCAB:
        return SPECIAL_IDS[key]
    if (key.endswith(("token_id", "token_index"))) and value >= VOCAB:
        return VOCAB - 1  # image / audio placeholders: never in the generated inputs
    return value


def shrink_kwargs(defaults: dict[str, Any], encoder_decoder: bool) -> dict[str, Any]:
    """The fields of a config's `to_dict()` to change for a tiny model (recursing into nested configs).

    Lists as long as the layer stack (`layer_types`, ...) are cut to the new depth; nested configs keep their
    `model_type` so that composite configs build the right class.
    """
    old_layers, changed = _layer_count(defaults), {}
    new_layers = _shrunk_value(LAYER_FIELDS[0], old_layers, encoder_decoder) if old_layers else None
    for key, value in defaults.items():
        if isinstance(value, dict) and value and all(str(k).isdigit() for k in value) and new_layers:
            changed[key] = {k: v for k, v in value.items() if int(k) < new_layers}  # per-layer settings
            continue
        if isinstance(value, dict) and key not in ("id2label", "label2id", "rope_parameters", "rope_scaling"):
            nested = shrink_kwargs(value, encoder_decoder)
            if nested:
                changed[key] = {**({"model_type": value["model_type"]} if "model_type" in value else {}), **nested}
            continue
        if isinstance(value, list) and old_layers and len(value) == old_layers and old_layers > 1:
            changed[key] = value[:new_layers]
            continue
        new = _shrunk_value(key, value, encoder_decoder)
        if new is not value:
            changed[key] = new
    changed.update({k: 0.0 for k in ("layerdrop", "encoder_layerdrop", "decoder_layerdrop") if k in defaults})
    return _keep_relations(defaults, changed)


def _keep_relations(defaults: dict[str, Any], changed: dict[str, Any]) -> dict[str, Any]:
    """Sizes that a config derives from others, or that must stay equal to others, set consistently."""
    computed = {
        "head_dim": HEAD_DIM,
        "num_key_value_heads": KV_HEADS,
        "num_experts_per_tok": 2,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
    }
    for key, size in computed.items():
        if key in defaults and defaults[key] is None:  # computed by some models' configs, not by others'
            changed[key] = size
    heads = next((k for k in ("num_attention_heads", "n_head", "num_heads") if k in defaults), None)
    for key in SIZES[2][1]:
        if heads and key in defaults and defaults[key] == defaults[heads]:
            changed[key] = HEADS  # as many key/value heads as heads (multi-head latent attention): kept so
    window = changed.get("attention_window", defaults.get("attention_window"))
    if window is not None:  # Longformer-style local attention pads inputs to a multiple of it
        changed["attention_window"] = [4] * len(window) if isinstance(window, list) else 4
    if "qk_head_dim" in defaults:  # multi-head latent attention: query/key = no-rotary part + rotary part
        changed["qk_head_dim"] = changed.get("qk_nope_head_dim", 0) + changed.get("qk_rope_head_dim", 0) or HEAD_DIM
    for part in ("qk_rope_head_dim", "qk_head_dim"):
        if "head_dim" in changed and part in changed and defaults.get("head_dim") == defaults[part]:
            changed["head_dim"] = changed[part]
    return changed


def tiny_config(model_class: type) -> Any:
    """The default config of `model_class` (its `config_class`), shrunk (`shrink_kwargs`), with a pad token, a
    decoder start token for encoder-decoder models and no cache."""
    config_class = model_class.config_class
    defaults = config_class().to_dict()
    encoder_decoder = bool(defaults.get("is_encoder_decoder")) or "encoder_layers" in defaults
    config = config_class(**shrink_kwargs(defaults, encoder_decoder))
    for sub in [config, *(getattr(config, name, None) for name in getattr(config, "sub_configs", {}))]:
        if sub is None:
            continue
        if getattr(sub, "pad_token_id", None) is None:
            sub.pad_token_id = 0  # sequence classification finds each row's last token by it
        sub.use_cache = False
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = config.pad_token_id
    config.num_labels = LABELS
    return config


def count_parameters_on_meta(model_class: type, config: Any) -> tuple[int, str]:
    """The parameter count of `model_class(config)`, built on the meta device (no memory, no init), and its
    largest parameter (`name shape`)."""
    with torch.device("meta"):
        model = model_class(config)
    name, largest = max(model.named_parameters(), key=lambda item: item[1].numel(), default=("-", torch.empty(0)))
    return sum(p.numel() for p in model.parameters()), f"largest {name} {list(largest.shape)}"


def tiny_inputs(auto: str, config: Any) -> dict[str, torch.Tensor]:
    """Token inputs with labels for the class's task; decoder inputs for encoder-decoder models (a decoder-only
    model with audio or image inputs in the sequence-to-sequence mapping gets causal labels)."""
    g = torch.Generator().manual_seed(1)
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", VOCAB)
    high = max(8, min(vocab, VOCAB) - 8)  # clear of the placeholder ids shrunk to the vocabulary's end
    ids = torch.randint(3, high, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -2:] = 0  # one padded row, so the attention mask matters
    inputs = {"input_ids": ids, "attention_mask": mask}
    if auto == "AutoModelForSequenceClassification":
        eos = getattr(config, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) and eos else eos
        if isinstance(eos, int) and eos < VOCAB:
            ids[:, -3] = eos  # one end-of-sequence token a row: BART-like heads pool there
    if auto == "AutoModelForSeq2SeqLM" and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(3, high, (BATCH, TARGET_SEQ), generator=g)
        inputs["labels"] = torch.randint(3, high, (BATCH, TARGET_SEQ), generator=g)
    elif auto == "AutoModelForSequenceClassification":
        inputs["labels"] = torch.randint(0, LABELS, (BATCH,), generator=g)
    elif auto == "AutoModelForMaskedLM":
        inputs["labels"] = torch.randint(3, high, (BATCH, SEQ), generator=g).masked_fill(mask == 0, -100)
    else:
        inputs["labels"] = ids.masked_fill(mask == 0, -100)
    return inputs


def objective(output: Any) -> torch.Tensor:
    """The loss, or (without one) a fixed reduction of the first output, to compare gradients."""
    loss = getattr(output, "loss", None)
    return loss if loss is not None else output[0].float().pow(2).mean()


# ------------------------------------------------------------------------------------------- checks
def _short(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:240] if lines else ''}".rstrip(": ")


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _outputs(output: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in output.items() if isinstance(v, torch.Tensor)}


def first_difference(want: dict, have: dict, kind: str) -> str | None:
    """`None` when `have` equals `want` (same keys, atol 1e-5), else which entry differs and by how much."""
    if want.keys() != have.keys():
        missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
        return f"{kind} missing {missing[:3]}" if missing else f"{kind} unexpected {extra[:3]}"
    for name, value in want.items():
        got = have[name]
        if got.shape != value.shape:
            return f"{kind} {name}: shape {tuple(got.shape)} != {tuple(value.shape)}"
        if not torch.allclose(got.float(), value.float(), atol=ATOL, rtol=ATOL, equal_nan=True):
            diff = (got.float() - value.float()).abs().nan_to_num(float("inf")).max().item()
            return f"{kind} {name}: max difference {diff:.2e}"
    return None


def _stock_run(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    torch.manual_seed(0)
    output = model(**inputs)
    loss = objective(output)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"the stock model's loss is {loss.item()}")
    loss.backward()
    return _outputs(output), _grads(model)


def _pipelined_run(model: torch.nn.Module, stages: int, inputs: dict[str, torch.Tensor]) -> tuple[Any, dict, dict]:
    from optimum_ipu import IPUConfig, to_pipelined
    from optimum_ipu.models.layout import layers_per_stage
    from optimum_ipu.runtime.stages.cut import run_stages_in_turn

    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=STAGES[stages]), parallelize=True).train()
    counts = layers_per_stage(pipelined.ipu_config, pipelined.num_layers)
    torch.manual_seed(0)
    output, _ = run_stages_in_turn(model, pipelined.stage_cut(), counts, inputs, objective=objective)
    return pipelined.plan, _outputs(output), _grads(model)


def _build(info: dict[str, str], class_name: str, record: dict[str, Any]) -> tuple[Any, Any] | None:
    """The tiny model (training mode) and its config, or `None` with the record marked unbuildable."""
    import transformers

    try:
        model_class = getattr(transformers, class_name)
        config = tiny_config(model_class)
        record["parameters"], largest = count_parameters_on_meta(model_class, config)
    except Exception as error:  # noqa: BLE001 - any failure is this category's reason
        record.update(category="unbuildable", reason=f"config: {_short(error)}")
        return None
    if record["parameters"] > MAX_PARAMETERS:
        reason = f"config could not be shrunk: {record['parameters']:,} parameters on the meta device ({largest})"
        record.update(category="unbuildable", reason=reason)
        return None
    try:
        torch.manual_seed(0)
        model = model_class(config).train()
        languages = getattr(config, "languages", None)
        if hasattr(model, "set_default_language") and languages:
            model.set_default_language(languages[0])  # X-MOD: one adapter per language
        return model, config
    except Exception as error:  # noqa: BLE001
        record.update(category="unbuildable", reason=f"build: {_short(error)}")
        return None


def _plan_kind(model: torch.nn.Module, record: dict[str, Any]) -> bool:
    """Record `plan` (`registered` / `derived`); `False` with the record marked when no plan can be had."""
    from optimum_ipu import IncompatibleIPUConfigError
    from optimum_ipu.models.plans import plan_for_model

    try:
        record["plan"] = "derived" if plan_for_model(model).derived else "registered"
        return True
    except IncompatibleIPUConfigError as error:
        refused = "no list of identical layers" in str(error)
        record.update(plan="none", category="no_layer_list" if refused else "refused", reason=_short(error))
    except Exception as error:  # noqa: BLE001
        record.update(plan="none", category="crashed", reason=f"plan: {_short(error)}")
    return False


def check_class(class_name: str, info: dict[str, str] | None = None) -> dict[str, Any]:
    """Build `class_name` tiny and compare its 2- and 3-stage runs with the stock model (see the module doc).

    Returns:
        `dict`: `class`, `model_type`, `auto`, `plan` (`registered` / `derived` / `none`), `stages_2` and
        `stages_3` (`"pass"`, `"mismatch"`, `"crash"` or `None` when not run), `category` (a key of
        `CATEGORIES`), `reason`, `parameters`.
    """
    from optimum_ipu import IncompatibleIPUConfigError

    info = info or zoo_classes()[class_name]
    record: dict[str, Any] = {
        "class": class_name,
        **info,
        "plan": None,
        "stages_2": None,
        "stages_3": None,
        "category": None,
        "reason": "",
        "parameters": None,
    }
    built = _build(info, class_name, record)
    if built is None or not _plan_kind(built[0], record):
        return record
    model, config = built
    pristine = copy.deepcopy(model)
    inputs = tiny_inputs(info["auto"], config)
    try:
        want_outputs, want_grads = _stock_run(model, inputs)
    except Exception as error:  # noqa: BLE001
        record.update(category="unbuildable", reason=f"stock forward: {_short(error)}")
        return record
    problems = []
    for stages in STAGES:
        try:
            _, outputs, grads = _pipelined_run(copy.deepcopy(pristine), stages, inputs)
        except IncompatibleIPUConfigError as error:  # the runtime's clear refusal, not a crash
            record[f"stages_{stages}"] = "refused"
            problems.append(("refused", f"{stages} stages: {_short(error)}"))
            continue
        except Exception as error:  # noqa: BLE001
            record[f"stages_{stages}"] = "crash"
            problems.append(("crashed", f"{stages} stages: {_short(error)}"))
            continue
        difference = first_difference(want_outputs, outputs, "output") or first_difference(want_grads, grads, "grad")
        record[f"stages_{stages}"] = "pass" if difference is None else "mismatch"
        if difference is not None:
            problems.append(("mismatch", f"{stages} stages: {difference}"))
    if not problems:
        record.update(category="passes", reason="")
    else:  # a crash outranks a mismatch, which outranks a refusal; the first stage count's reason is given
        found = {c for c, _ in problems}
        category = next(c for c in ("crashed", "mismatch", "refused") if c in found)
        record.update(category=category, reason=next(r for c, r in problems if c == category))
    return record


# ------------------------------------------------------------------------------------------ workers
def quiet() -> None:
    """Silence the per-class warnings (derived plans, config validation) of a sweep."""
    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    logging.getLogger("optimum_ipu").setLevel(logging.ERROR)
    torch.set_num_threads(1)


def _worker(connection: Any) -> None:
    quiet()
    classes = zoo_classes()
    while True:
        class_name = connection.recv()
        if class_name is None:
            return
        try:
            connection.send(check_class(class_name, classes[class_name]))
        except Exception as error:  # noqa: BLE001 - check_class itself failing is still one class's result
            connection.send({"class": class_name, "category": "crashed", "reason": _short(error)})


class WorkerPool:
    """One worker process that checks classes one at a time; restarted after a hang or a crash."""

    def __init__(self, timeout: float) -> None:
        self.timeout, self.process, self.connection = timeout, None, None
        self.context = multiprocessing.get_context("spawn")

    def _start(self) -> None:
        self.connection, child = self.context.Pipe()
        self.process = self.context.Process(target=_worker, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def stop(self) -> None:
        """End the worker (asked first, then killed)."""
        if self.process is None:
            return
        try:
            self.connection.send(None)
            self.process.join(5)
        except (BrokenPipeError, OSError):
            pass
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.process = None

    def check(self, class_name: str, info: dict[str, str]) -> dict[str, Any]:
        """`check_class` in the worker, or a `crashed` record naming the timeout or the exit code."""
        if self.process is None or not self.process.is_alive():
            self._start()
        try:
            self.connection.send(class_name)
            if self.connection.poll(self.timeout):
                return self.connection.recv()
            reason = f"TimeoutError: no result within {self.timeout:g} s (hang); worker restarted"
        except (EOFError, OSError):  # the worker's end closed: it died
            reason = "worker died"
        self.process.kill()
        self.process.join()
        reason = reason if self.process.exitcode is None or "Timeout" in reason else f"{reason} ({self._exit()})"
        self.process = None
        return {
            "class": class_name,
            **info,
            "plan": None,
            "stages_2": None,
            "stages_3": None,
            "category": "crashed",
            "reason": reason,
            "parameters": None,
        }

    def _exit(self) -> str:
        code = self.process.exitcode
        return f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"


# ------------------------------------------------------------------------------------------ reports
def summary_markdown(results: list[dict[str, Any]]) -> str:
    """Counts per category and the table class -> plan -> 2 stages -> 3 stages -> reason."""
    counts = Counter(r["category"] for r in results)
    lines = [f"{len(results)} classes", "", "| category | classes | meaning |", "|---|---|---|"]
    lines += [f"| {c} | {counts.get(c, 0)} | {meaning} |" for c, meaning in CATEGORIES.items()]
    plans = Counter(r["plan"] for r in results if r["category"] == "passes")
    lines += ["", f"passing: {plans.get('registered', 0)} registered, {plans.get('derived', 0)} derived", ""]
    lines += ["| class | plan | 2 stages | 3 stages | category | reason |", "|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (list(CATEGORIES).index(r["category"]), r["class"])):
        reason = (r.get("reason") or "").replace("|", "\\|")
        lines.append(
            f"| {r['class']} | {r.get('plan') or '-'} | {r.get('stages_2') or '-'} | "
            f"{r.get('stages_3') or '-'} | {r['category']} | {reason} |"
        )
    return "\n".join(lines)


def run_sweep(classes: dict[str, dict[str, str]], timeout: float) -> list[dict[str, Any]]:
    """Check every class in a worker process, one at a time, printing one line per class."""
    pool, results = WorkerPool(timeout), []
    try:
        for i, (name, info) in enumerate(classes.items()):
            start = time.perf_counter()
            record = pool.check(name, info)
            record["seconds"] = round(time.perf_counter() - start, 2)
            results.append(record)
            print(
                f"[{i + 1}/{len(classes)}] {name}: {record['category']} {record.get('reason', '')}"[:200],
                file=sys.stderr,
                flush=True,
            )
    finally:
        pool.stop()
    return results


def main(argv: list[str] | None = None) -> None:
    """Run the sweep, write the JSON and print the markdown summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", help="comma-separated class names (default: every class of the four mappings)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per class before it counts as a hang")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "model_zoo.json"))
    parser.add_argument("--summarize", metavar="JSON", help="print the summary of a sweep's JSON (nothing is run)")
    args = parser.parse_args(argv)
    if args.summarize:
        print(summary_markdown(json.loads(Path(args.summarize).read_text())["classes"]))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    everything = zoo_classes()
    wanted = args.classes.split(",") if args.classes else list(everything)
    unknown = [c for c in wanted if c not in everything]
    if unknown:
        parser.error(f"--classes: {', '.join(unknown)} not in the four auto mappings")
    start = time.perf_counter()
    results = run_sweep({c: everything[c] for c in wanted}, args.timeout)
    import transformers

    report = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "stages": STAGES,
        "atol": ATOL,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "seconds": round(time.perf_counter() - start, 1),
        "categories": CATEGORIES,
        "counts": dict(Counter(r["category"] for r in results)),
        "classes": results,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    print(summary_markdown(results))


if __name__ == "__main__":
    main()
