"""The built-in stage plans, one module per domain. `BUILTIN_PLANS` is registered on first lookup
(`optimum_ipu.models.plans`); a user's own family goes through `register_stage_plan(...)` instead."""

from __future__ import annotations

from . import decoders, encoders, seq2seq, speech, vision

BUILTIN_PLANS = (*encoders.PLANS, *decoders.PLANS, *seq2seq.PLANS, *vision.PLANS, *speech.PLANS)
