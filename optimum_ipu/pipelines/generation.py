"""Generation tasks at static shapes, through `optimum_ipu.models.generation.generate_static`.

- `"text-generation"`: `transformers`' own `TextGenerationPipeline` (pre- and post-processing, chat inputs,
  `return_full_text`, ...), its `generate()` call replaced by `generate_static`.
- `"text2text-generation"`, `"summarization"`, `"translation"` (also `"translation_xx_to_yy"`): removed from
  `transformers` 5; written here with the outputs of their v4 pipelines (`{"generated_text"}`, `{"summary_text"}`,
  `{"translation_text"}`, or `*_token_ids` with `return_tensors=True`). The model config's
  `task_specific_params` for the task (T5's `"summarize: "` prefix, beam count, lengths, ...) apply as in v4,
  below the call's own parameters.

Prompts are padded to `max_seq_length` tokens (on the left for decoder-only models, on the right for
encoder-decoder ones) and batches to `host_batch_rows()` rows, so every call has the same shapes.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from transformers import GenerationConfig, Pipeline, TextGenerationPipeline

from ..models.generation import generate_static
from ..runtime.inference.runner import bucket_for, default_buckets
from ..runtime.serialization import weight_major_projection
from .base import StaticBatchingPipeline, position_limit


def _generate(
    pipe: Pipeline, input_ids: torch.Tensor, attention_mask: torch.Tensor, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """`generate_static` on a collated batch; returns the ids as `(prompts, sequences per prompt, length)`, and the
    prompts as they were padded (a decoder-only model's sequences start with them)."""
    params = pipe._get_set_generation_params(kwargs)
    limit = position_limit(pipe.model.config)
    if not pipe.model.config.is_encoder_decoder:
        if params.get("max_new_tokens") is None:
            raise ValueError(
                "text-generation at static shapes: give max_new_tokens (max_length would count the padding of "
                f"the prompts to max_seq_length={pipe.max_seq_length})"
            )
        if limit is not None and pipe.max_seq_length + params["max_new_tokens"] > limit:
            raise ValueError(
                f"max_seq_length={pipe.max_seq_length} prompt tokens + max_new_tokens={params['max_new_tokens']} is "
                f"more than the model's {limit} positions; lower one of them (pipeline(..., max_seq_length=N))"
            )
    device = pipe.engine.device
    input_ids, attention_mask, prompt_length = _prompt_bucket(pipe, input_ids, attention_mask, device)
    # on a CPU the projection onto the vocabulary runs weight-major (`WeightMajorLinear`: 2-3x faster at a few rows)
    with pipe.engine.autocast(), weight_major_projection(pipe.pipelined.model):
        output = generate_static(
            pipe.pipelined,  # (its stock model generates; a model holding one stage generates across the stages)
            input_ids.to(device),
            attention_mask.to(device),
            batch_size=pipe.static_batch_size,
            prompt_length=prompt_length,
            ipu_config=pipe.ipu_config,
            compile_decoding=pipe.runner.backend == "compile",
            **kwargs,
        )
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    return sequences.reshape(input_ids.shape[0], -1, sequences.shape[-1]), input_ids


def _prompt_bucket(
    pipe: Pipeline, input_ids: torch.Tensor, attention_mask: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The prompts and the length they are padded to: `max_seq_length` on an accelerator (one compiled or captured
    graph per shape, so one shape); on a CPU, which runs eagerly, the smallest of the default sequence buckets that
    holds the batch's longest prompt, so that the prefill does not compute padding (prompts of 7-12 tokens padded to
    64 made a 124 M GPT-2's 32-token answer 1.1x slower than `transformers serve`'s)."""
    if device.type != "cpu":
        return input_ids, attention_mask, pipe.max_seq_length
    longest = int(attention_mask.sum(dim=1).max()) if attention_mask.numel() else input_ids.shape[1]
    length = bucket_for(max(longest, 1), default_buckets(pipe.max_seq_length))
    if input_ids.shape[1] > length:  # padding columns only: left of a decoder's prompts, right of an encoder's
        keep = slice(0, length) if pipe.model.config.is_encoder_decoder else slice(input_ids.shape[1] - length, None)
        input_ids, attention_mask = input_ids[:, keep], attention_mask[:, keep]
    return input_ids, attention_mask, length


class IPUTextGenerationPipeline(TextGenerationPipeline, StaticBatchingPipeline):
    """`transformers.TextGenerationPipeline` (task `"text-generation"`) at static shapes, generating with
    `generate_static`. Same arguments and outputs (`{"generated_text"}`); the number of new tokens must be given
    as `max_new_tokens` (the default is `transformers`' 256), and prompt + new tokens must fit the model's
    positions. Without `do_sample=False`, `transformers`' defaults sample (temperature 0.7). With
    `backend="compile"` (the default on accelerators) the decoding steps run through `torch.compile` on CPUs too
    (`generate_static(compile_decoding=True)`): the first calls at 1 and at 2+ rows compile."""

    model_mapping = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
    default_max_seq_length = 64
    pads_rows = False
    # generate_static pads prompts itself; "compile": its decoding steps through torch.compile (compile_decoding)
    backends = ("eager", "compile")
    bucketed = False

    def _resolve_max_seq_length(self, config: Any, max_seq_length: int | None) -> int:
        limit = position_limit(config)
        if max_seq_length is None and limit is not None:  # leave room for as many new tokens as prompt tokens
            return min(self.default_max_seq_length, limit // 2)
        return super()._resolve_max_seq_length(config, max_seq_length)

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:
        input_ids = model_inputs["input_ids"]
        if input_ids.shape[1] == 0 or not bool(model_inputs["attention_mask"].any(dim=1).all()):
            raise ValueError("text-generation: a prompt is empty; static generation continues a prompt of 1+ tokens")
        prompt_text = model_inputs.pop("prompt_text")
        # As transformers: a total length (not a number of new tokens) includes the prefix's tokens.
        prefix_length = generate_kwargs.pop("prefix_length", 0)
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        if prefix_length:
            params = self._get_set_generation_params(generate_kwargs)
            for length, new_tokens in (("max_length", "max_new_tokens"), ("min_length", "min_new_tokens")):
                if length in params and new_tokens not in params:
                    generate_kwargs[length] = params[length] + prefix_length
        sequences, input_ids = _generate(self, input_ids, model_inputs["attention_mask"], generate_kwargs)
        # `input_ids` as padded: postprocess cuts the prompt off the sequences by its length.
        return {"generated_sequence": sequences, "input_ids": input_ids, "prompt_text": prompt_text}


class ReturnType(enum.Enum):
    """What the text-to-text pipelines return: token ids or text."""

    TENSORS = 0
    TEXT = 1


class IPUText2TextGenerationPipeline(StaticBatchingPipeline):
    """Text-to-text generation with an encoder-decoder model (task `"text2text-generation"`), as `transformers`' v4
    pipeline: `pipe("question: ... context: ...")` returns `[{"generated_text": ...}]`, and a list of texts one
    result per text. `generate()` arguments (`max_new_tokens`, `max_length`, `num_beams`, ...) are accepted at
    construction and per call; without them, the model's generation config applies (as v4 and `generate()`).

    Call parameters:
        return_tensors (`bool`, defaults to `False`): return `{"generated_token_ids"}` instead of text.
        clean_up_tokenization_spaces (`bool`, defaults to `False`): clean up the decoded text.
        truncation (`bool`, defaults to `False`): cut inputs to `max_seq_length` tokens (else a longer input is an
            error).
        prefix (`str`): put before every input; defaults to the task's `task_specific_params` prefix, else the
            model config's `prefix`.
        max_input_length (`int`): Optimum Graphcore's input budget. Given to `pipeline()`, it is `max_seq_length`
            (inputs padded to it) and longer inputs are cut to it by default, as there; given to a call, that call's
            inputs are cut to it (at most the pipeline's `max_seq_length`).
    """

    model_mapping = "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"
    return_name = "generated"
    pads_rows = False
    backends = ("eager",)  # generate_static pads prompts to max_seq_length itself
    bucketed = False
    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    cut_by_default = False  # (pipeline(..., max_input_length=N): longer inputs are cut to N, as Optimum Graphcore did)

    def __init__(self, *args: Any, max_input_length: int | None = None, **kwargs: Any) -> None:
        if max_input_length is not None:  # Optimum Graphcore's name of the input budget: inputs padded and cut to it
            if kwargs.get("max_seq_length") not in (None, max_input_length):
                raise ValueError(
                    f"max_input_length={max_input_length} and max_seq_length={kwargs['max_seq_length']}: both name "
                    "the input token budget; give one"
                )
            kwargs["max_seq_length"] = max_input_length
            self.cut_by_default = True
        super().__init__(*args, **kwargs)
        params = dict(self.task_specific_params())
        # v4 applied these to the model config; here they rank below the user's own generation arguments.
        self.task_prefix = params.pop("prefix", None)
        generation_keys = {key for key in vars(GenerationConfig()) if not key.startswith("_")}
        self._generate_kwargs = {**{k: v for k, v in params.items() if k in generation_keys}, **self._generate_kwargs}

    def task_specific_params(self) -> dict[str, Any]:
        """The model config's `task_specific_params` entry of this pipeline's task (empty when there is none)."""
        return (getattr(self.model.config, "task_specific_params", None) or {}).get(self.task, {})

    def __call__(self, inputs: str | list[str], **kwargs: Any) -> list[dict[str, Any]]:
        """Generate from one text (a list of one result) or a list of texts (one result per text)."""
        results = super().__call__(inputs, **kwargs)
        if isinstance(inputs, str):
            return results
        if isinstance(inputs, list) and all(isinstance(r, list) and len(r) == 1 for r in results):
            return [r[0] for r in results]
        return results

    def _sanitize_parameters(
        self,
        return_tensors: bool | None = None,
        return_text: bool | None = None,
        return_type: ReturnType | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        truncation: bool | None = None,
        prefix: str | None = None,
        max_input_length: int | None = None,
        **generate_kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        preprocess: dict[str, Any] = {}
        if truncation is None and self.cut_by_default:
            truncation = True  # Optimum Graphcore's max_input_length cut longer inputs to it
        if truncation is not None:
            preprocess["truncation"] = truncation
        if max_input_length is not None:  # a call's own budget: within the pipeline's padded length
            if not isinstance(max_input_length, int) or not 0 < max_input_length <= self.max_seq_length:
                raise ValueError(
                    f"max_input_length: got {max_input_length!r}; a call may cut its inputs to at most the "
                    f"pipeline's {self.max_seq_length} tokens (build it with pipeline(..., max_input_length=N))"
                )
            preprocess.update(truncation=True, max_length=max_input_length)
        if prefix is not None:
            preprocess["prefix"] = prefix
        postprocess: dict[str, Any] = {}
        if return_tensors is not None and return_type is None:
            return_type = ReturnType.TENSORS if return_tensors else ReturnType.TEXT
        if return_text is not None and return_type is None:
            return_type = ReturnType.TEXT if return_text else ReturnType.TENSORS
        if return_type is not None:
            postprocess["return_type"] = return_type
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess, generate_kwargs, postprocess

    def preprocess(
        self, inputs: str, truncation: bool = False, prefix: str | None = None, max_length: int | None = None
    ) -> dict[str, Any]:
        if not isinstance(inputs, str):
            raise ValueError(f"{self.task}: expected a text (or a list of texts), got {type(inputs).__name__}")
        if prefix is None:
            prefix = self.task_prefix if self.task_prefix is not None else getattr(self.model.config, "prefix", None)
        encoded = self.tokenizer(
            (prefix or "") + inputs,
            truncation=truncation,
            max_length=(max_length or self.max_seq_length) if truncation else None,
            return_tensors="pt",
        )
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:
        kwargs = self._prepare_generate_kwargs(generate_kwargs)
        return {"output_ids": _generate(self, model_inputs["input_ids"], model_inputs["attention_mask"], kwargs)[0]}

    def postprocess(
        self,
        model_outputs: dict[str, Any],
        return_type: ReturnType = ReturnType.TEXT,
        clean_up_tokenization_spaces: bool = False,
    ) -> list[dict[str, Any]]:
        records = []
        for ids in model_outputs["output_ids"][0]:
            if return_type == ReturnType.TENSORS:
                records.append({f"{self.return_name}_token_ids": ids})
            else:
                text = self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
                records.append({f"{self.return_name}_text": text})
        return records


class IPUSummarizationPipeline(IPUText2TextGenerationPipeline):
    """Summarization (task `"summarization"`), as `transformers`' v4 pipeline: `[{"summary_text": ...}]`. T5
    configs' `task_specific_params["summarization"]` give the `"summarize: "` prefix and generation defaults."""

    return_name = "summary"


class IPUTranslationPipeline(IPUText2TextGenerationPipeline):
    """Translation (tasks `"translation"`, `"translation_xx_to_yy"`), as `transformers`' v4 pipeline:
    `[{"translation_text": ...}]`. The languages come from the task name (`"translation_en_to_ro"`) or from
    `src_lang` / `tgt_lang` given at construction; T5 configs' `task_specific_params["translation_en_to_ro"]` give
    the prefix (`"translate English to Romanian: "`) and generation defaults."""

    return_name = "translation"

    def __init__(self, *args: Any, src_lang: str | None = None, tgt_lang: str | None = None, **kwargs: Any) -> None:
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        super().__init__(*args, **kwargs)

    def _sanitize_parameters(
        self, src_lang: str | None = None, tgt_lang: str | None = None, **kwargs: Any
    ) -> tuple[dict, dict, dict]:
        for name, value in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
            if value is not None and value != getattr(self, name, None):
                raise ValueError(
                    f"{name}={value!r}: the languages choose the prefix and generation defaults when the pipeline is "
                    f"built; pass {name} to pipeline() (or a task such as 'translation_en_to_ro')"
                )
        return super()._sanitize_parameters(**kwargs)

    def task_specific_params(self) -> dict[str, Any]:
        params = getattr(self.model.config, "task_specific_params", None) or {}
        parts = self.task.split("_")
        if len(parts) == 4 and parts[0] == "translation" and parts[2] == "to":
            self.src_lang, self.tgt_lang = self.src_lang or parts[1], self.tgt_lang or parts[3]
        if self.src_lang and self.tgt_lang:
            return params.get(f"translation_{self.src_lang}_to_{self.tgt_lang}", {})
        return params.get(self.task, {})
