"""The stock model inside an adapter wrapper (`peft`'s `PeftModel`), found through the wrapper's own API: what the
plans (`models.plans`) and a process's stage hold (`stage_hold`) both read. It imports nothing, `peft` least of all."""

from __future__ import annotations

from typing import Any


def unwrap_adapters(model: Any) -> tuple[str, Any]:
    """The stock `transformers` model inside an adapter wrapper and its dotted path there: `peft`'s `PeftModel` holds
    it at `base_model.model` (its `get_base_model()`); `("", model)` for a model that is not wrapped. Read from the
    wrapper's own API, so `peft` is never imported here."""
    if not callable(getattr(type(model), "get_base_model", None)):
        return "", model
    inner = model.get_base_model()
    for name, module in model.named_modules():
        if module is inner:
            return name, inner
    return "", model
