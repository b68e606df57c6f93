"""Which processors a pipeline task needs (tokenizer, image processor, feature extractor) and loading them from a
model folder: text tasks take a tokenizer, images an image processor, audio a feature extractor (speech
recognition also the tokenizer that decodes its tokens)."""

from __future__ import annotations

from typing import Any

import transformers

_LOADERS = {
    "tokenizer": "AutoTokenizer",
    "image_processor": "AutoImageProcessor",
    "feature_extractor": "AutoFeatureExtractor",
}


def processors_of(pipeline_class: type) -> tuple[str, ...]:
    """The processor arguments a pipeline class needs (`("tokenizer",)` unless it says otherwise)."""
    return tuple(getattr(pipeline_class, "processors", ("tokenizer",)))


def load_processors(
    path: str, needed: tuple[str, ...], given: dict[str, Any], revision: str | None = None
) -> dict[str, Any]:
    """Each processor of `needed` not in `given`, loaded from the folder (or Hub id) `path`, at `revision` when
    given, with its `transformers` auto class; a clear error names the one the folder lacks."""
    loaded = {}
    for name in needed:
        if given.get(name) is not None:
            continue
        try:
            hub = {"revision": revision} if revision is not None else {}
            loaded[name] = getattr(transformers, _LOADERS[name]).from_pretrained(path, **hub)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"{path}: no {name} could be loaded from it ({type(err).__name__}); pass {name}= to pipeline()"
            ) from None
    return loaded
