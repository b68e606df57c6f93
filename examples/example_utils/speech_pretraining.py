"""What `examples/speech-pretraining/run_pretraining.py` is made of: Wav2Vec2's pretraining collator, the Gumbel
temperature decay and the logging of the loss's two parts, as `transformers`' `run_wav2vec2_pretraining_no_trainer.py`
does them, for `IPUTrainer`.

- `DataCollatorForWav2Vec2Pretraining` pads a batch (to one fixed length: static shapes) and draws the masked frames
  and the sampled negatives with `transformers`' own `_compute_mask_indices` and `_sample_negative_indices`, once per
  batch on the host: every pipeline stage is then fed the same (`StagePlan.process_stage_inputs`).
- `GumbelTemperatureCallback` sets the quantizer's temperature before each optimizer step to
  `max(max_gumbel_temperature * gumbel_temperature_decay**step, min_gumbel_temperature)`, the schedule of upstream's
  loop, on whatever wraps the model (`PipelinedModel`, DDP, a process's stage container).
- `LossParts` keeps the contrastive and diversity losses of the training forwards (the model returns them beside
  its loss, which `IPUTrainer` logs) and gives them per masked frame at each log, as upstream's script logs them,
  with the codevector perplexity and the temperature; summed over every process first (with stages on separate
  processes, the last stage's process holds them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import FeatureExtractionMixin, PreTrainedModel, TrainerCallback
from transformers.models.wav2vec2.modeling_wav2vec2 import _compute_mask_indices, _sample_negative_indices

from optimum_ipu import IPUTrainer


@dataclass
class DataCollatorForWav2Vec2Pretraining:
    """Pads `input_values` and draws what Wav2Vec2's contrastive loss is computed on, as `transformers`' example.

    Args:
        model (`PreTrainedModel`): the `Wav2Vec2ForPreTraining` (its config's `mask_time_prob`, `mask_time_length`,
            `mask_time_min_masks` and `num_negatives`, and its convolutions' output lengths).
        feature_extractor (`FeatureExtractionMixin`): pads the clips and returns their attention mask.
        max_length (`int`, *optional*): pad every batch to this many samples (static shapes); `None`: to the longest.

    Returns (on call, given a list of `{"input_values": [...]}`):
        `dict[str, torch.Tensor]`: `input_values`, `attention_mask` (if the extractor returns one),
        `mask_time_indices` (batch, frames) and `sampled_negative_indices` (batch, frames, num_negatives).
    """

    model: PreTrainedModel
    feature_extractor: FeatureExtractionMixin
    max_length: int | None = None

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        padding = {"padding": "max_length", "max_length": self.max_length} if self.max_length else {"padding": True}
        inputs = [{"input_values": f["input_values"]} for f in features]
        batch = dict(self.feature_extractor.pad(inputs, return_tensors="pt", **padding))
        batch_size, samples = batch["input_values"].shape
        frames = int(self.model._get_feat_extract_output_lengths(samples))
        # no frame of padding is masked, nor sampled as a negative
        frame_mask = None
        if batch.get("attention_mask") is not None:
            frame_mask = self.model._get_feature_vector_attention_mask(frames, batch["attention_mask"])
        config = self.model.config
        mask = _compute_mask_indices(
            (batch_size, frames),
            config.mask_time_prob,
            config.mask_time_length,
            attention_mask=frame_mask,
            min_masks=config.mask_time_min_masks,
        )
        negatives = _sample_negative_indices((batch_size, frames), config.num_negatives, mask_time_indices=mask)
        batch["mask_time_indices"] = torch.as_tensor(mask, dtype=torch.long)
        batch["sampled_negative_indices"] = torch.as_tensor(negatives, dtype=torch.long)
        return batch


def pretraining_module(model: nn.Module) -> nn.Module:
    """The module with `set_gumbel_temperature` inside whatever wraps it (itself if it has it)."""
    for module in model.modules():
        if hasattr(module, "set_gumbel_temperature"):
            return module
    raise ValueError(f"{type(model).__name__} holds no module with set_gumbel_temperature (Wav2Vec2ForPreTraining)")


def gumbel_temperature(step: int, maximum: float, minimum: float, decay: float) -> float:
    """Upstream's schedule: `max(maximum * decay**step, minimum)` at optimizer step `step` (from 0)."""
    return max(maximum * decay**step, minimum)


class GumbelTemperatureCallback(TrainerCallback):
    """Sets the Gumbel softmax temperature of the quantizer before each optimizer step (and at the start of training,
    a resumed run included) to `gumbel_temperature(state.global_step, ...)`.

    Args:
        maximum (`float`): the temperature at step 0 (`--max_gumbel_temperature`).
        minimum (`float`): its floor (`--min_gumbel_temperature`).
        decay (`float`): its factor per optimizer step (`--gumbel_temperature_decay`).
    """

    def __init__(self, maximum: float, minimum: float, decay: float) -> None:
        self.maximum, self.minimum, self.decay = maximum, minimum, decay
        self.current: float | None = None

    def _set(self, model: nn.Module | None, step: int) -> None:
        if model is None:
            return
        self.current = gumbel_temperature(step, self.maximum, self.minimum, self.decay)
        pretraining_module(model).set_gumbel_temperature(self.current)

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs: Any
    ) -> None:
        self._set(model, state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs: Any) -> None:
        self._set(model, state.global_step)


class LossParts(TrainerCallback):
    """Sums the contrastive loss, the diversity loss, the masked frames and the codevector perplexity of the training
    forwards of `model` (a forward hook; evaluation and the stages' layer probes are left out), until `take()`.

    A micro-batch's forward may run twice in an optimizer step: with stages on separate processes, the first step's
    metadata inference runs the last stage once more on micro-batch 0, on empty activations. Forwards are therefore
    kept per micro-batch (by its `mask_time_indices` tensor, held until the step ends so that no other takes its
    place), the last one counting, and added up at the end of each optimizer step.

    Args:
        model (`nn.Module`): the `Wav2Vec2ForPreTraining`, or anything that wraps it.
    """

    def __init__(self, model: nn.Module) -> None:
        # contrastive, diversity, masked frames, forwards, perplexity
        self._sums = torch.zeros(5, dtype=torch.float64)
        self._step: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.handle = pretraining_module(model).register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        contrastive = getattr(output, "contrastive_loss", None)
        if not (module.training and torch.is_grad_enabled()) or contrastive is None or contrastive.is_meta:
            return
        mask = kwargs["mask_time_indices"]
        parts = [contrastive, output.diversity_loss, mask.sum(), torch.ones(()), output.codevector_perplexity]
        self._step[id(mask)] = (mask, torch.stack([p.detach().to("cpu", torch.float64) for p in parts]))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for _, parts in self._step.values():
            self._sums += parts
        self._step.clear()

    def take(self) -> dict[str, float]:
        """The parts since the last call, per masked frame (`contrastive_loss`, `diversity_loss`, as upstream logs
        them) and the mean `codevector_perplexity`, over every process; `{}` if no training forward ran."""
        sums = self._sums.clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums)  # every process calls it at the same log; the ones that ran no loss add zeros
        self._sums.zero_()
        contrastive, diversity, frames, forwards, perplexity = sums.tolist()
        if forwards == 0:
            return {}
        return {
            "contrastive_loss": contrastive / frames,
            "diversity_loss": diversity / frames,
            "codevector_perplexity": perplexity / forwards,
        }


class PretrainingTrainer(IPUTrainer):
    """`IPUTrainer` that decays the Gumbel temperature, logs the loss's parts with each training loss, and evaluates the
    model's own loss (`eval_loss`, summed over the masked frames as in training).

    Args:
        gumbel (`tuple[float, float, float]`): the maximum and minimum temperature and the decay per step.
        args, kwargs: those of `IPUTrainer`.
    """

    def __init__(self, model: nn.Module, *args: Any, gumbel: tuple[float, float, float], **kwargs: Any) -> None:
        self.temperature, self.loss_parts = GumbelTemperatureCallback(*gumbel), LossParts(model)
        callbacks = [self.temperature, self.loss_parts, *(kwargs.pop("callbacks", None) or [])]
        super().__init__(model, *args, callbacks=callbacks, **kwargs)
        # the model computes its loss without labels (from the collator's masks and negatives): evaluation asks for
        # it (`eval_loss`: the quantizer's argmax codes, no Gumbel noise, no dropout)
        self.can_return_loss = True

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training log, on every process at once (take() sums over them)
            logs.update(self.loss_parts.take())
            if self.temperature.current is not None:
                logs["gumbel_temperature"] = self.temperature.current
        super().log(logs, start_time)
