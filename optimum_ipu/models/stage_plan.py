"""`StagePlan`: everything optimum-ipu knows about a `transformers` model family, in one declarative record.

A plan is applied to the unmodified `transformers` model. Paths are relative to `model.base_model` (HF's own
accessor: `model.bert` for `BertForQuestionAnswering`, the model itself for `BertModel` or T5). The input and
output embeddings come from HF's own `get_input_embeddings()` / `get_output_embeddings()`, so heads need no
paths. The record is declared here, below everything that makes plans: the built-in families
(`optimum_ipu.models.families`), the derived plans (`optimum_ipu.models.derived`) and the registry that holds
them (`optimum_ipu.models.plans`).

This module imports no torch: `optimum_ipu` imports it eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

INPUT_KINDS = ("tokens", "pixels", "audio")
VOCABULARY_LOSS_KINDS = ("masked", "causal")
# the config fields of attention head counts across families (those a config lacks are not checked)
TENSOR_PARALLEL_COUNTS = (
    "num_attention_heads",
    "num_key_value_heads",
    "num_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "intermediate_size",
    "d_ff",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
)
TENSOR_PARALLEL_STYLES = ("colwise", "colwise_qkv", "rowwise")


def no_position_offset(config: Any) -> int:
    """Positions numbered from 0 (most families)."""
    return 0


def position_offset_after_padding(config: Any) -> int:
    """RoBERTa's numbering: positions start after the padding index, at `pad_token_id + 1`."""
    return (config.pad_token_id or 0) + 1


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a plan is registered once
class StagePlan:
    """How one model family is cut into pipeline stages, and every other fact the library needs about it.

    Args:
        family (`str`): the `model_type` of the family's configs (`"bert"`, `"gpt2"`, ...).
        classes (`tuple[str, ...]`): the `transformers` class names this plan supports.
        embeddings (`tuple[str, ...]`): the modules whose output becomes the first layer's hidden states (placed
            with stage 0). With stages on separate processes, only a stage that makes the hidden states holds them;
            another runs them for their output's shape only (`runtime.stages.cut.ShapeOnly`). Modules without
            parameters (rotary tables) run on every stage.
        layers (`tuple[str, ...]`): `nn.ModuleList`s of the layers, counted together in `layers_per_ipu` in this
            order (encoder-decoder: encoder list then decoder list). `"a|b"`: the first that exists (renames
            across `transformers` versions); a trailing `"?"`: optional (T5's decoder, absent in `T5EncoderModel`).
        layer_count_fields (`tuple[str, ...]`): config attributes whose sum is the number of layers (read before
            a model is built, by `optimum-ipu config check --model`).
        encoder (`str`, *optional*): encoder-decoder families: the encoder stack, whose output travels with every
            decoder stage (`layers[0]` is its layer list). `None` for encoders and decoders alone.
        input_kind (`str`, *optional*, defaults to `"tokens"`): `"tokens"`, `"pixels"` or `"audio"`: what the model's
            main input is (`generate_static` pads token prompts, and only the batch of other inputs).
        vocabulary_loss (`Mapping[str, str]`, *optional*): classes whose loss is a cross-entropy over the vocabulary
            from the output projection, so that `projection_serialization_factor` may compute both in chunks:
            `"masked"` (labels aligned with positions) or `"causal"` (position t predicts token t + 1).
        position_offset (`Callable[[config], int]`, *optional*): the first position id (RoBERTa: `pad_token_id + 1`),
            for packed rows that restart positions.
        packing (`bool`, *optional*, defaults to `False`): its forward takes `position_ids` and a ready 4-D mask, so
            sequences can be packed into one row (checked against running each alone in `tests/test_packing.py`).
        attention_dropout_field (`str`, *optional*): the config field of its attention dropout.
        sequence_head (`Callable`, *optional*): `(model, first_token_states) -> logits` of its
            `...ForSequenceClassification` head applied to each packed sequence's first token (packing only).
        embeddings_feed_hidden_states_only (`bool`, *optional*, defaults to `True`): the embeddings' output reaches
            the rest of the model only as the first layer's hidden states, so a stage that receives those may run them
            for their shape only and not hold them. `False` where the output carries an embedding's output too
            (Wav2Vec2's `extract_features`): every stage then holds and runs them.
        layer_stand_in (`Callable`, *optional*): `(layer) -> nn.Module` standing in for a layer of another stage
            when the stages run apart, where a bare pass-through would change the numbers (T5's first block
            computes the position bias that the others share); its `borrowed_parameters()`, if any, are held by
            every stage that runs it.
        process_stages (`bool`, *optional*, defaults to `True`): stages may run on separate processes.
        process_stages_reason (`str`, *optional*): why not, when they may not.
        process_stage_inputs (`tuple[str, ...]`, *optional*): inputs that every batch must carry when the stages run
            on separate processes: what the model would otherwise draw at random inside its forward, on each stage
            apart (Wav2Vec2's masked frames and sampled negatives), so the host draws them once and every stage is
            fed the same (`PipelineEngine` refuses a batch without them).
        derived (`bool`, *optional*, defaults to `False`): derived from the model's structure, not registered.
        onnx_fusion_model_type (`str`, *optional*): the model type whose fusions ONNX Runtime's transformer
            optimizer applies to the family's exported graph (one of `onnxruntime.transformers.optimizer.MODEL_TYPES`),
            where it is not the family's own: `"bert"` for RoBERTa and DistilBERT, whose encoders are BERT's. `None`:
            the family's `model_type` (fused only if the optimizer names it). Read through `onnx_model_type`.
        all_layer_outputs_flags (`tuple[str, ...]`, *optional*, defaults to `("use_weighted_layer_sum",)`): config
            flags that, when true, make a head on the last stage read every layer's output (the speech heads'
            weighted layer sum), so that the stages cannot run on separate processes (`process_stages_refusal`).
        model_module (`str`, *optional*): the module that defines the family's model classes where `transformers`
            does not (GroupBERT: `"optimum_ipu.models.modeling_groupbert"`, Optimum Graphcore's own model). Importing
            it registers its `model_type` with `transformers`' auto classes (`load_model_modules`); its classes are
            found there, and its `__all__` is served at Optimum Graphcore's path of the family.
        graphcore_aliases (`Mapping[str, str]`, *optional*): Optimum Graphcore's names at the family's path that are
            not `Pipelined` + a class name -> that `transformers` class name (HuBERT's `PipelinedHubertCTC`).
        graphcore_extras (`Mapping[str, str]`, *optional*): Optimum Graphcore's other names at the family's path ->
            the `transformers` attribute that does the job (Whisper's `WhisperProcessorTorch`).
        graphcore_submodules (`tuple[str, ...]`, *optional*): Optimum Graphcore's submodules of the family's path,
            besides `modeling_<family>`, that held such names (Whisper's `processing_whisper`); each serves them.
        tensor_parallel (`Mapping[str, str]`, *optional*): how `tensor_parallel_size` splits each layer: paths
            relative to a layer (`*` matches one level: T5's `"layer.*.SelfAttention.q"`) -> `"colwise"` (the
            projections that open a block: query/key/value, up/gate, fc1) or `"rowwise"` (those that close it:
            attention output, down, fc2); `"colwise"` on an `nn.Embedding` splits its features (T5's position bias,
            one feature a head); `"colwise_qkv"`: one fused query|key|value projection, each third split alike
            (GPT-2's `c_attn`). `transformers`' `Conv1D` (GPT-2's) is split as an `nn.Linear` is. The vocabulary
            embedding and output projection are split by vocabulary rows in every plan that has this. Empty: the
            family runs without tensor parallelism (`tensor_parallel_refusal` says why).
        tensor_parallel_divided (`tuple[str, ...]`, *optional*): `"path.attribute"` relative to a layer: integer
            attributes a layer reads as its count of heads or features when it builds a tensor of that size itself
            (T5's `n_heads`), divided by the size on each device.
        tensor_parallel_counts (`tuple[str, ...]`, *optional*, defaults to the attention head counts): config fields
            whose values must divide by `tensor_parallel_size` (a one-line error names the one that does not).
        tensor_parallel_reason (`str`, *optional*): why the family has no tensor-parallel plan, when it has none.
    """

    family: str
    classes: tuple[str, ...]
    embeddings: tuple[str, ...]
    layers: tuple[str, ...]
    layer_count_fields: tuple[str, ...] = ("num_hidden_layers",)
    encoder: str | None = None
    input_kind: str = "tokens"
    vocabulary_loss: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    position_offset: Callable[[Any], int] = no_position_offset
    packing: bool = False
    attention_dropout_field: str = "attention_dropout"
    sequence_head: Callable[[Any, Any], Any] | None = None
    embeddings_feed_hidden_states_only: bool = True
    layer_stand_in: Callable[[Any], Any] | None = None
    process_stages: bool = True
    process_stages_reason: str = ""
    process_stage_inputs: tuple[str, ...] = ()
    derived: bool = False
    onnx_fusion_model_type: str | None = None
    all_layer_outputs_flags: tuple[str, ...] = ("use_weighted_layer_sum",)
    model_module: str | None = None
    graphcore_aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    graphcore_extras: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    graphcore_submodules: tuple[str, ...] = ()
    tensor_parallel: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    tensor_parallel_divided: tuple[str, ...] = ()
    tensor_parallel_counts: tuple[str, ...] = TENSOR_PARALLEL_COUNTS
    tensor_parallel_reason: str = ""

    def __post_init__(self) -> None:
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"StagePlan {self.family}: input_kind {self.input_kind!r}; expected one of {INPUT_KINDS}")
        if not self.layers:
            raise ValueError(f"StagePlan {self.family}: layers is empty; name the model's layer list(s)")
        if self.encoder is not None and len(self.layers) != 2:
            raise ValueError(f"StagePlan {self.family}: an encoder-decoder plan names 2 layer lists (encoder, decoder)")
        unknown = {k: v for k, v in self.vocabulary_loss.items() if v not in VOCABULARY_LOSS_KINDS}
        if unknown:
            raise ValueError(f"StagePlan {self.family}: vocabulary_loss {unknown}; kinds are {VOCABULARY_LOSS_KINDS}")
        bad = {k: v for k, v in self.tensor_parallel.items() if v not in TENSOR_PARALLEL_STYLES}
        if bad:
            raise ValueError(f"StagePlan {self.family}: tensor_parallel {bad}; styles are {TENSOR_PARALLEL_STYLES}")
        for name in ("vocabulary_loss", "graphcore_aliases", "graphcore_extras", "tensor_parallel"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def num_layers(self, config: Any) -> int:
        """Number of pipeline layers of a model with this `transformers` config (before it is built)."""
        total = 0
        for name in self.layer_count_fields:
            value = getattr(config, name, None)
            if name == "num_decoder_layers" and value is None:
                value = getattr(config, "num_layers", 0)  # T5: decoder depth defaults to encoder depth
            total += int(value or 0)
        return total

    @property
    def onnx_model_type(self) -> str:
        """The model type ONNX Runtime's transformer optimizer fuses this family's exported graph as."""
        return self.onnx_fusion_model_type or self.family

    def loss_kind(self, class_name: str) -> str | None:
        """`"masked"` / `"causal"` when the class's loss is a vocabulary cross-entropy, else `None`."""
        return self.vocabulary_loss.get(class_name)

    def process_stages_refusal(self, model: Any) -> str:
        """Why a model of this plan cannot run its pipeline stages on separate processes; `""` when it can.

        Args:
            model (`transformers.PreTrainedModel`): the model (its config's flags are read).

        Returns:
            `str`: the reason, to follow "cannot run its pipeline stages on separate processes: ", or `""`.
        """
        config = getattr(model, "config", None)
        for flag in self.all_layer_outputs_flags:
            if getattr(config, flag, False):
                return f"with {flag} its head on the last stage reads every layer's output"
        if not self.process_stages:
            return self.process_stages_reason or f"the {self.family} plan runs its stages in one process"
        return ""

    def tensor_parallel_refusal(self) -> str:
        """Why a model of this plan cannot split its layers over devices (`tensor_parallel_size` > 1); `""` when it
        can."""
        if self.tensor_parallel:
            return ""
        return self.tensor_parallel_reason or f"the {self.family} plan has no tensor-parallel split yet"

    def default_task(self) -> str:
        """The head a model of this family is measured with when none is named (`optimum-ipu config balance`):
        `"translation"` for an encoder-decoder, `"causal-lm"` where a class has a causal vocabulary loss,
        `"question-answering"` where a class is a `...ForQuestionAnswering`, else `""`."""
        if self.encoder is not None:
            return "translation"
        if "causal" in self.vocabulary_loss.values():
            return "causal-lm"
        if any(name.endswith("ForQuestionAnswering") for name in self.classes):
            return "question-answering"
        return ""
