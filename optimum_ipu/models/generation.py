"""Generation at static shapes: fixed batch and prompt sizes, and a KV cache allocated once at its full length.

On an IPU a generation loop is one compiled graph of fixed shapes; the same holds for `torch.compile` and CUDA
graphs here. `generate_static` pads the batch and the prompt to fixed sizes and asks `transformers` for its
static KV cache (`cache_implementation="static"`), so every decoding step has the same shapes. Greedy and
beam search give the tokens of the stock model's `generate()` on the unpadded inputs.

A model whose stages run on separate processes (loaded under `torchrun` with an `IPUConfig` of several stages, each
process holding its stage only) generates the same way: every process of the replica calls `generate()` with the same
inputs, each keeps its own layers and their part of the KV cache, and all return the same tokens
(`optimum_ipu.runtime.stages.generation.StageGeneration`); a batch of several rows decodes in groups in flight, one
per stage, so every stage computes at each moment.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import CompileConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.utils.logging import get_logger

from ..config import IPUConfig
from ..runtime.devices import detect_devices
from ..runtime.distributed import world_size
from ..runtime.stages.generation import StageGeneration
from ..runtime.stages.hold import stage_hold
from .plans import plan_for_model
from .stage_plan import StagePlan

if TYPE_CHECKING:
    from transformers.utils import ModelOutput

logger = get_logger(__name__)  # transformers' logger: warning_once, once a message per process
_WARNED: list[bool] = []  # the one-process, several-GPU warning is given once


class StaticGeneration:
    """`generate()` at static shapes for a wrapper of a `transformers` model: `PipelinedModel` inherits it, and
    `generate_static` reads the wrapper's model, config and plan.

    Attributes:
        model (`transformers.PreTrainedModel`): the stock model that generates.
        ipu_config (`IPUConfig`): the config whose `inference_parallelize_kwargs` give the defaults.
        plan (`StagePlan`): the model's stage plan (its `input_kind`).
    """

    model: nn.Module
    ipu_config: IPUConfig
    plan: StagePlan

    def generate(
        self, inputs: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> Any:
        """`generate()` of the stock model at static shapes, as Optimum Graphcore's pipelined models generate: the
        KV cache allocated once (`generate_static`), with the config's `inference_parallelize_kwargs`
        (`use_cache`, `max_num_beams`, `max_length`, ...) as defaults.

        Args:
            inputs (`torch.Tensor`): the prompts (`input_ids`; for speech models `input_features`), also accepted
                by those keyword names.
            attention_mask (`torch.Tensor`, *optional*): 1 for tokens, 0 for padding.
            kwargs: `generate()`'s arguments (`max_new_tokens`, `num_beams`, ...) and `generate_static`'s
                (`batch_size`, `prompt_length`).
        """
        for name in ("input_ids", "input_features"):
            if inputs is None and name in kwargs:
                inputs = kwargs.pop(name)
        if inputs is None:
            raise ValueError("generate: give the prompts as `input_ids` (or `input_features` for a speech model)")
        return generate_static(self, inputs, attention_mask, **kwargs)


def generate_static(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    batch_size: int | None = None,
    prompt_length: int | None = None,
    ipu_config: IPUConfig | None = None,
    compile_decoding: bool = False,
    **generate_kwargs: Any,
) -> torch.Tensor | ModelOutput:
    """`model.generate()` with the batch padded to `batch_size` rows and prompts to `prompt_length` tokens.

    Args:
        model (`transformers.PreTrainedModel` or `PipelinedModel`): a model with `generate()` (a pipelined model
            generates through its stock model); its stage plan's `input_kind` says whether prompts are tokens.
        input_ids (`torch.Tensor` of shape `(batch, length)`): prompts, right-padded for encoder-decoder
            models and left-padded for decoder-only ones (as their tokenizers do for generation).
        attention_mask (`torch.Tensor`, *optional*): 1 for tokens, 0 for padding.
        batch_size (`int`, *optional*): rows to pad the batch to (the last batch of a data set is short); the
            padded rows are dropped from the result.
        prompt_length (`int`, *optional*): tokens to pad each prompt to; longer prompts are an error.
        generate_kwargs: passed to `generate()` (`max_new_tokens`, `num_beams`, ...). Other model inputs with a
            batch axis are not padded: pass only `input_ids` and `attention_mask` with `batch_size`.

        ipu_config (`IPUConfig`, *optional*): the config whose `inference_parallelize_kwargs` (Optimum Graphcore's
            knobs of the KV cache) give the defaults of the arguments not given: `use_cache` (`False`: no KV
            cache), `num_beams`, `max_length` (when neither `max_length` nor `max_new_tokens` is given) and
            `batch_size`. Defaults to a `PipelinedModel`'s own config.
        compile_decoding (`bool`, *optional*, defaults to `False`): run a decoder-only model's decoding steps (not
            the prefill) through `torch.compile`, as `transformers` does on its own on accelerators, on every device
            (`decoding_compile_config`); the tokens are those of the eager steps. A model whose stages run on
            separate processes decodes eagerly.

    Returns:
        `torch.Tensor`: the generated ids of the real rows, as `generate()` returns them. With
        `return_dict_in_generate=True`, `generate()`'s output whose `sequences` holds the real rows (its other
        fields, such as the cache and scores, keep the padded batch).

    Example:

    ```python
    >>> batch = tokenizer(["translate English to Romanian: Hello"], return_tensors="pt")
    >>> ids = generate_static(model, batch.input_ids, batch.attention_mask, batch_size=8, prompt_length=64,
    ...                       max_length=32, num_beams=3)
    >>> tokenizer.batch_decode(ids, skip_special_tokens=True)
    ```
    """
    wrapper = model if isinstance(model, StaticGeneration) else None
    if isinstance(model, StaticGeneration):
        ipu_config = model.ipu_config if ipu_config is None else ipu_config
        plan, model = model.plan, model.model
    else:
        plan = plan_for_model(model)
    generation = _stage_generation(model, wrapper, ipu_config, generate_kwargs)
    staged = generation.generating() if generation is not None else contextlib.nullcontext()
    knobs = _generation_knobs(ipu_config, wrapper)
    if knobs:
        batch_size = _apply_parallelize_kwargs(knobs, batch_size, generate_kwargs)
    if plan.input_kind != "tokens":  # speech (Whisper's input_features): fixed-size inputs, rows padded
        with staged:
            return _generate_from_features(model, input_ids, attention_mask, batch_size, generate_kwargs)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids: expected a (batch, length) tensor, got shape {tuple(input_ids.shape)}")
    if batch_size is not None and input_ids.shape[0] > batch_size:
        raise ValueError(
            f"a batch of {input_ids.shape[0]} prompts is larger than batch_size {batch_size}: raise batch_size or "
            "split the batch"
        )
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    rows, length = input_ids.shape
    pad_id = _pad_token_id(model)
    if prompt_length is not None and length < prompt_length:
        extra = prompt_length - length
        ids_pad = input_ids.new_full((rows, extra), pad_id)
        mask_pad = attention_mask.new_zeros((rows, extra))
        left = not getattr(model.config, "is_encoder_decoder", False)  # decoder-only models continue the last token
        input_ids = torch.cat([ids_pad, input_ids] if left else [input_ids, ids_pad], dim=1)
        attention_mask = torch.cat([mask_pad, attention_mask] if left else [attention_mask, mask_pad], dim=1)
    elif prompt_length is not None and length > prompt_length:
        raise ValueError(f"a prompt has {length} tokens but prompt_length is {prompt_length}: raise prompt_length")
    if batch_size is not None and rows < batch_size:
        # pad rows repeat the first row: a row of padding only would attend to nothing
        input_ids = torch.cat([input_ids, input_ids[:1].expand(batch_size - rows, -1)])
        attention_mask = torch.cat([attention_mask, attention_mask[:1].expand(batch_size - rows, -1)])
    if generate_kwargs.get("use_cache") is not False:
        generate_kwargs.setdefault("cache_implementation", "static")
        if compile_decoding and generation is None:
            generate_kwargs.setdefault("compile_config", decoding_compile_config(input_ids.device))
    generate_kwargs.setdefault("pad_token_id", pad_id)
    generate = generation.generate if generation is not None else model.generate
    with torch.no_grad(), staged:
        output = generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)
    keep = rows * _sequences_per_input(model, generate_kwargs)
    if isinstance(output, torch.Tensor):
        return output[:keep]
    output.sequences = output.sequences[:keep]
    return output


def stage_generation(wrapper: StaticGeneration) -> StageGeneration | None:
    """The `StageGeneration` of `wrapper`'s model when this process holds one of its stages (made once per wrapper),
    else None: what decodes its rows through the stages outside `generate()` (continuous batching)."""
    if stage_hold(wrapper.model) is None:
        return None
    return _stage_generation(wrapper.model, wrapper, wrapper.ipu_config, {})


def _stage_generation(
    model: nn.Module, wrapper: StaticGeneration | None, ipu_config: IPUConfig | None, generate_kwargs: dict[str, Any]
) -> StageGeneration | None:
    """The stages' `StageGeneration` when this process holds one stage of `model` (made once per wrapper: it learns
    the stand-ins of other stages' layers at its first call); `None` otherwise."""
    hold = stage_hold(model)
    if hold is None:
        if len(set((getattr(model, "hf_device_map", None) or {}).values())) <= 1:  # not placed a stage a GPU
            _warn_one_process_stages(ipu_config)
        return None
    generation = getattr(wrapper, "_stage_generation", None)
    if generation is None:
        cut = wrapper.stage_cut() if wrapper is not None else hold.cut  # the cut the stage was held by
        generation = StageGeneration(model, cut, hold)
        if wrapper is not None:
            wrapper.__dict__["_stage_generation"] = generation
    # a compiled forward would trace the stage's sends and receives: the decoding loop runs eagerly
    generate_kwargs.setdefault("disable_compile", True)
    return generation


def _warn_one_process_stages(ipu_config: IPUConfig | None) -> None:
    """Say once that one process runs every stage on one device, where several GPUs could each take one."""
    stages = ipu_config.value("ipus_per_replica", inference=True) if ipu_config is not None else 1
    if stages > 1 and world_size() == 1 and not _WARNED and detect_devices().count > 1:
        _WARNED.append(True)
        logger.warning(
            "generate: the %d pipeline stages run in turn on one GPU of this process; to spread them, load with "
            'from_pretrained(..., device_map="stages") (stage i on GPU i) or launch one process per stage '
            "(torchrun --nproc_per_node=%d)",
            stages,
            stages,
        )


def _generation_knobs(ipu_config: IPUConfig | None, wrapper: StaticGeneration | None) -> dict[str, Any]:
    """Optimum Graphcore's generation knobs: the config's `inference_parallelize_kwargs`, under those given to the
    wrapper's `parallelize(**knobs)` (`PipelinedModel.generation_defaults`)."""
    knobs = dict(ipu_config.value("parallelize_kwargs", inference=True)) if ipu_config is not None else {}
    return {**knobs, **getattr(wrapper, "generation_defaults", {})}


def _apply_parallelize_kwargs(
    knobs: dict[str, Any], batch_size: int | None, generate_kwargs: dict[str, Any]
) -> int | None:
    """Optimum Graphcore's generation `knobs` (`_generation_knobs`) as defaults of this call (in place); returns the
    batch size to pad to. The keys without effect are reported once where they are given."""
    given = {k for k, v in generate_kwargs.items() if v is not None}  # None: not given (Seq2SeqTrainer passes it)
    if "use_cache" in knobs and "use_cache" not in given:
        generate_kwargs["use_cache"] = bool(knobs["use_cache"])
    if "num_beams" in knobs and "num_beams" not in given:
        generate_kwargs["num_beams"] = knobs["num_beams"]
    if "max_length" in knobs and not given & {"max_length", "max_new_tokens"}:
        generate_kwargs["max_length"] = knobs["max_length"]
    return batch_size if batch_size is not None else knobs.get("batch_size")


def main_input_name(model: nn.Module) -> str:
    """The input `generate()` starts from: `"input_ids"`, or e.g. Whisper's `"input_features"`."""
    model = model.model if isinstance(model, StaticGeneration) else model
    return getattr(model, "main_input_name", "input_ids")


def decoding_compile_config(device: torch.device) -> CompileConfig | None:
    """How `generate()` compiles a decoding step on the static KV cache (`compile_decoding=True`): on an accelerator,
    `transformers`' own default (it compiles there by itself, CUDA graphs included); on a CPU, where it does not,
    inductor with dynamic shapes, so that one graph serves every cache length and one more every batch of 2+ rows (a
    size of 1 is specialised): a random 124 M GPT-2's 32-token answer took 0.78-0.83x the eager steps' time on a
    2-core CPU, the same greedy tokens (BENCHMARKS.md). Its first calls at 1 and at 2+ rows compile (15-30 s each
    on that CPU)."""
    if device.type != "cpu":
        return None
    config = CompileConfig(dynamic=True, mode="default")
    if not hasattr(config, "_compile_all_devices"):  # the switch transformers reads before compiling off accelerators
        logger.warning_once(
            "compile_decoding: this transformers version does not compile a decoding step on a CPU; eager"
        )
        return None
    config._compile_all_devices = True
    return config


def speech_cache_implementation(device: torch.device) -> str:
    """The KV cache Whisper generates with: static where a step is compiled or captured (accelerators); on a CPU,
    eager, its dynamic one, since the static cache's full-length attention (448 self-attention positions every step)
    made `jfk.flac` take 46 s against 3.6 s, and 16 FSDD clips 1.4 s each."""
    return "dynamic" if device.type == "cpu" else "static"


def _generate_from_features(
    model: nn.Module,
    features: torch.Tensor,
    attention_mask: torch.Tensor | None,
    batch_size: int | None,
    generate_kwargs: dict[str, Any],
) -> torch.Tensor | ModelOutput:
    """`generate_static` for a model whose main input is not tokens (Whisper's log-mel `input_features`, already of
    one size): only the batch is padded, with copies of the first row, which are dropped from the result."""
    rows = features.shape[0]
    if batch_size is not None and rows > batch_size:
        raise ValueError(f"a batch of {rows} inputs is larger than batch_size {batch_size}: raise batch_size")
    if batch_size is not None and rows < batch_size:
        features = torch.cat([features, features[:1].expand(batch_size - rows, *features.shape[1:])])
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask[:1].expand(batch_size - rows, -1)])
    if generate_kwargs.get("use_cache") is not False:
        generate_kwargs.setdefault("cache_implementation", speech_cache_implementation(features.device))
    if features.is_floating_point() and features.dtype != model.dtype:  # e.g. `.half()` features, an fp32 model
        features = features.to(model.dtype)
    inputs = {main_input_name(model): features}
    if attention_mask is not None:
        inputs["attention_mask"] = attention_mask
    with torch.no_grad():
        output = model.generate(**inputs, **generate_kwargs)
    keep = rows * _sequences_per_input(model, generate_kwargs)
    if isinstance(output, torch.Tensor):
        return output[:keep]
    output.sequences = output.sequences[:keep]
    return output


def _sequences_per_input(model: nn.Module, generate_kwargs: dict[str, Any]) -> int:
    """How many consecutive rows `generate()` returns per input (`num_return_sequences`)."""
    per_input = generate_kwargs.get("num_return_sequences") or getattr(
        getattr(model, "generation_config", None), "num_return_sequences", None
    )
    return per_input or 1


def _pad_token_id(model: nn.Module) -> int:
    config = model.generation_config if getattr(model, "generation_config", None) is not None else model.config
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


class BeamSharedCrossAttentionCache(EncoderDecoderCache):
    """`transformers`' encoder-decoder KV cache whose cross-attention keys and values are given before decoding
    (`cross_attention_cache`) and are not reordered between beam-search steps: every beam of an input attends to the
    same encoder output, so their rows are equal and reordering them only copies (Whisper tiny.en with 5 beams:
    4 layers x 2 x 5 beams x 1,500 positions x 384 values, 92 MB a step)."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the self-attention keys and values only (the cross-attention rows of one input's beams are
        equal)."""
        self.self_attention_cache.reorder_cache(beam_idx)


def cache_keyword(model: nn.Module) -> str:
    """The keyword the model's `forward` and `generate()` take a `Cache` by: `cache` (`transformers` 5.2x), else
    `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cross_attention_cache(model: nn.Module, encoder_outputs: Any, beams: int) -> BeamSharedCrossAttentionCache:
    """A KV cache holding the cross-attention keys and values of `encoder_outputs` for `generate()` with `beams`
    beams (or returned sequences) per input: computed by one step of the model's own decoder at one row per input,
    then shared by the beams (stride-0 views of the row for one input, repeated rows for several), where `generate()`
    would project the encoder output once per beam (Whisper tiny.en, 5 beams: 17.7 GFLOP instead of 3.5). The
    decoding that follows gives the same tokens.

    Args:
        model (`transformers.PreTrainedModel`): an encoder-decoder model whose attention caches its cross-attention
            in an `EncoderDecoderCache` (Whisper, BART, T5, ...).
        encoder_outputs (`transformers.modeling_outputs.BaseModelOutput`): its encoder's output, one row per input.
        beams (`int`): rows `generate()` expands each input to (`num_beams`, or `num_return_sequences` when larger).

    Returns:
        `BeamSharedCrossAttentionCache`: pass it to `generate()` under `cache_keyword(model)`, without a
        `cache_implementation`.
    """
    filled = BeamSharedCrossAttentionCache(DynamicCache(), DynamicCache())
    hidden = encoder_outputs.last_hidden_state
    start = getattr(model.generation_config, "decoder_start_token_id", None) or model.config.decoder_start_token_id
    ids = torch.full((hidden.shape[0], 1), int(start), dtype=torch.long, device=hidden.device)
    # the decoder alone: the step's logits are not wanted (Whisper's vocabulary head would cost 7 ms of the call)
    decoder = model.get_decoder()
    with torch.no_grad():
        decoder(input_ids=ids, encoder_hidden_states=hidden, use_cache=True, **{cache_keyword(decoder): filled})
    cross = filled.cross_attention_cache
    if beams > 1 and hidden.shape[0] == 1:
        # one input: the beams' rows are views of its one row (stride 0), not copies; attention reads the same
        # keys and values from cache for every beam (Whisper tiny.en, 5 beams: 0.37 ms a layer instead of 0.67)
        for layer in cross.layers:
            layer.keys = layer.keys.expand(beams, *layer.keys.shape[1:])
            layer.values = layer.values.expand(beams, *layer.values.shape[1:])
    elif beams > 1:
        cross.batch_repeat_interleave(beams)
    return BeamSharedCrossAttentionCache(DynamicCache(), cross)
