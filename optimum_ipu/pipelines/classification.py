"""The encoder tasks `transformers` 5 still has, at static shapes: their own pre- and post-processing, the model
run by the engine (`StaticBatchingPipeline`). Each `_forward` keeps what `transformers`' `_forward` passes on to
`postprocess` and replaces only the model call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from transformers import (
    FillMaskPipeline,
    TextClassificationPipeline,
    TokenClassificationPipeline,
    ZeroShotClassificationPipeline,
)

from .base import StaticBatchingPipeline


class IPUTextClassificationPipeline(TextClassificationPipeline, StaticBatchingPipeline):
    """`transformers.TextClassificationPipeline` (tasks `"text-classification"`, `"sentiment-analysis"`) at static
    shapes. Same arguments and outputs (`{"label", "score"}`), plus those of `StaticBatchingPipeline`."""

    model_mapping = "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.run_model(model_inputs)


class IPUTokenClassificationPipeline(TokenClassificationPipeline, StaticBatchingPipeline):
    """`transformers.TokenClassificationPipeline` (tasks `"token-classification"`, `"ner"`) at static shapes. Same
    arguments (`aggregation_strategy`, `ignore_labels`, `stride`, ...) and outputs; texts are cut to
    `max_seq_length` tokens (with `stride`, into windows of that length), as `transformers` cuts them to the
    tokenizer's `model_max_length`."""

    model_mapping = "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"
    chunked = True
    _PASSED_ON = ("special_tokens_mask", "offset_mapping", "sentence", "is_last", "word_ids", "word_to_chars_map")

    def __init__(
        self,
        *args: Any,
        padding: Any = None,
        max_length: int | None = None,
        max_seq_length: int | None = None,
        **kwargs,
    ) -> None:
        """Optimum Graphcore's pipeline took the tokenizer's `padding` and `max_length` (its NER notebook passes
        `padding="max_length", max_length=256`): inputs are padded here anyway (to static shapes: the same results),
        and `max_length` is the length they are cut to, `max_seq_length` when that is not given."""
        super().__init__(*args, max_seq_length=max_length if max_seq_length is None else max_seq_length, **kwargs)

    def preprocess(self, sentence: Any, offset_mapping: Any = None, **preprocess_params: Any) -> Iterator[dict]:
        tokenizer_params = {**preprocess_params.get("tokenizer_params", {}), "max_length": self.max_seq_length}
        yield from super().preprocess(
            sentence, offset_mapping=offset_mapping, **{**preprocess_params, "tokenizer_params": tokenizer_params}
        )

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        passed_on = {key: model_inputs.pop(key, None) for key in self._PASSED_ON}
        outputs = self.run_model(model_inputs)
        return {"logits": outputs["logits"], **passed_on, **model_inputs}


class IPUFillMaskPipeline(FillMaskPipeline, StaticBatchingPipeline):
    """`transformers.FillMaskPipeline` (task `"fill-mask"`) at static shapes. Same arguments (`top_k`, `targets`)
    and outputs (`{"score", "token", "token_str", "sequence"}`); the padding is left out of `sequence` as
    `transformers` leaves it out of its own padded batches."""

    model_mapping = "MODEL_FOR_MASKED_LM_MAPPING_NAMES"

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
        outputs = self.run_model(model_inputs)
        outputs["input_ids"] = model_inputs["input_ids"]
        return outputs


class IPUZeroShotClassificationPipeline(ZeroShotClassificationPipeline, StaticBatchingPipeline):
    """`transformers.ZeroShotClassificationPipeline` (task `"zero-shot-classification"`) at static shapes: one model
    input per (sequence, candidate label) pair, batched like any other. Same arguments (`candidate_labels`,
    `hypothesis_template`, `multi_label`) and outputs (`{"sequence", "labels", "scores"}`). The model's
    `label2id` must name an "entailment" label, as `transformers` requires."""

    model_mapping = "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"
    chunked = True

    def _forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        model_inputs = {key: inputs[key] for key in self.tokenizer.model_input_names if key in inputs}
        outputs = self.run_model(model_inputs)
        passed_on = {key: inputs[key] for key in ("candidate_label", "sequence", "is_last")}
        return {**passed_on, **outputs}
