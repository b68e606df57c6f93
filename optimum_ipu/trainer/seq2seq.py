"""`IPUSeq2SeqTrainer` and `IPUSeq2SeqTrainingArguments`: `IPUTrainer` for translation and summarization.

Built on `transformers`' own `Seq2SeqTrainer` / `Seq2SeqTrainingArguments` (multiple inheritance, not a copy):
their arguments (`predict_with_generate`, `generation_max_length`, `generation_num_beams`, `generation_config`,
`sortish_sampler`), their `evaluate(max_length=..., num_beams=...)` / `predict(...)` and their generation
config handling are used as they are. What changes is how an evaluation batch is generated: at static shapes,
through `optimum_ipu.models.generation.generate_static` (the batch padded to the evaluation batch size, prompts
padded to `generation_prompt_length`, transformers' static KV cache allocated once at its full length), so a
compiled generation graph never sees a new shape, and the generated tokens of every batch are padded to the
same length.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from ..config import IPUConfig
from ..models.generation import generate_static, main_input_name
from .static_batch import pad_to_static_batch, select_rows
from .trainer import IPUTrainer
from .training_args import IPUTrainingArguments

logger = logging.getLogger(__name__)


@dataclass
class IPUSeq2SeqTrainingArguments(IPUTrainingArguments, Seq2SeqTrainingArguments):
    r"""
    `IPUTrainingArguments` with the generation arguments of `transformers.Seq2SeqTrainingArguments`.

    Args:
        predict_with_generate (`bool`, *optional*, defaults to `False`):
            Evaluate and predict by generating (for generative metrics such as BLEU and ROUGE) instead of teacher
            forcing.
        generation_max_length (`int`, *optional*):
            `max_length` of generation in `evaluate` / `predict` (defaults to the model's generation config).
        generation_num_beams (`int`, *optional*):
            `num_beams` of generation in `evaluate` / `predict` (defaults to the model's generation config).
        generation_config (`str`, `Path` or `GenerationConfig`, *optional*):
            A generation config (or a folder / file holding one) that replaces the model's.
        generation_prompt_length (`int`, *optional*):
            Tokens every prompt is padded to for generation, so every batch has the same shape (an IPU compiles one
            graph; `torch.compile` and CUDA graphs likewise). Longer prompts are an error. Defaults to the length
            of each batch as the collator made it (static when the data is padded to a fixed length, e.g.
            `--pad_to_max_length`). The example scripts set it to `--max_source_length`.
        sortish_sampler (`bool`, *optional*, defaults to `False`):
            Accepted for compatibility; without effect, as in `transformers` 5 (which no longer has the sampler).
    """

    generation_prompt_length: int | None = field(
        default=None, metadata={"help": "Pad every prompt to this many tokens for generation (static shapes)."}
    )

    def __post_init__(self) -> None:
        for name in ("generation_max_length", "generation_num_beams", "generation_prompt_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name}: got {value}; expected a positive number, or leave it unset")
        if self.sortish_sampler:
            logger.warning("--sortish_sampler has no effect: transformers 5 no longer has the sampler")
        super().__post_init__()


class IPUSeq2SeqTrainer(IPUTrainer, Seq2SeqTrainer):
    """`IPUTrainer` for sequence-to-sequence models, with `transformers.Seq2SeqTrainer`'s generation interface.

    `evaluate()` and `predict()` take `max_length`, `num_beams` and other `generate()` arguments as in
    `Seq2SeqTrainer`; with `args.predict_with_generate` they score generated tokens, produced at static shapes:
    each batch is padded to the evaluation batch size (`per_device_eval_batch_size x inference_device_iterations`,
    padded rows dropped from the predictions), each prompt to `args.generation_prompt_length`, and the KV cache
    is transformers' static cache. Predictions (and shorter labels) are padded with the pad token to the
    generation length (`max_length`, or `max_new_tokens + 1`), so every batch gives the same shape. Generation
    takes the batch's `input_ids` and `attention_mask` (target-side inputs such as `labels` and
    `decoder_input_ids` only serve the loss).

    Args:
        model (`transformers.PreTrainedModel`): a model of a registered class with `generate()`
            (e.g. `T5ForConditionalGeneration`).
        ipu_config (`IPUConfig`, *optional*): the execution configuration; defaults to `args.ipu_config_name`.
        args (`IPUSeq2SeqTrainingArguments`, *optional*): the training arguments.
        kwargs: everything else `transformers.Seq2SeqTrainer` takes (datasets, collator, `processing_class`,
            `compute_metrics`, callbacks, ...).

    Example:

    ```python
    >>> trainer = IPUSeq2SeqTrainer(model, args=IPUSeq2SeqTrainingArguments("out", predict_with_generate=True),
    ...                             eval_dataset=dev, processing_class=tokenizer, compute_metrics=bleu)
    >>> trainer.evaluate(max_length=64, num_beams=4)["eval_bleu"]
    ```
    """

    def __init__(
        self,
        model: nn.Module,
        ipu_config: IPUConfig | None = None,
        args: IPUSeq2SeqTrainingArguments | None = None,
        **kwargs: Any,
    ) -> None:
        if args is None:
            args = IPUSeq2SeqTrainingArguments(output_dir="trainer_output")
        if isinstance(args, IPUTrainingArguments) and not isinstance(args, Seq2SeqTrainingArguments):
            raise TypeError(
                f"IPUSeq2SeqTrainer needs IPUSeq2SeqTrainingArguments, got {type(args).__name__}; build the arguments "
                "with IPUSeq2SeqTrainingArguments (same fields, plus predict_with_generate and generation_*)"
            )
        super().__init__(model, ipu_config, args, **kwargs)

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
        **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Loss by teacher forcing (as `IPUTrainer`), and with `predict_with_generate` the generated tokens at
        static shapes in place of the logits. Keyword arguments, or those given to `evaluate` / `predict`, go to
        `generate()`."""
        if not self.args.predict_with_generate or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        real = None
        if self.args.pad_on_batch_axis:
            inputs, real = pad_to_static_batch(inputs, self.eval_batch_per_call)
        # the loss of the whole batch, by the parent's path (engine precision, inference layout)
        loss = None
        if "labels" in inputs:
            loss = super().prediction_step(model, dict(inputs), True, ignore_keys=ignore_keys)[0]
        inputs = self._prepare_inputs(inputs)
        main = main_input_name(self.model)  # input_ids; Whisper: input_features
        if main not in inputs:
            raise ValueError(
                f"predict_with_generate needs `{main}` in the evaluation batches; got {sorted(inputs)}. Keep the "
                "model inputs in the dataset (remove_unused_columns keeps model inputs)"
            )
        gen_kwargs = gen_kwargs or dict(getattr(self, "_gen_kwargs", {}))
        # `None` means "the generation config's value", as in Seq2SeqTrainer
        gen_kwargs = {k: v for k, v in gen_kwargs.items() if not (k in ("num_beams", "max_length") and v is None)}
        gen_kwargs.pop("synced_gpus", None)  # each replica generates on its own: no sharded weights here
        generated = self._generate(inputs, gen_kwargs)
        length = self._output_length(generated, gen_kwargs, inputs[main].shape[-1])
        if generated.shape[-1] < length:
            generated = self._pad_tensors_to_max_len(generated, length)
        labels = inputs.get("labels")
        if labels is not None and labels.shape[-1] < length:
            labels = self._pad_tensors_to_max_len(labels, length)
        if real is not None and not bool(real.all()):
            real = real.to(generated.device)
            generated, labels = select_rows(generated, real), select_rows(labels, real)
        return loss, generated, labels

    def _generate(self, inputs: dict[str, Any], gen_kwargs: dict[str, Any]) -> torch.Tensor:
        with self.engine.autocast():
            generated = generate_static(
                self.model,
                inputs[main_input_name(self.model)],
                inputs.get("attention_mask"),
                batch_size=self.eval_batch_per_call,
                prompt_length=self.args.generation_prompt_length,
                ipu_config=self.ipu_config,
                **gen_kwargs,
            )
        # generate() marks a config derived from the model config; clear the mark so it is not rebuilt every
        # batch (what Seq2SeqTrainer does too)
        if getattr(self.model.generation_config, "_from_model_config", False):
            self.model.generation_config._from_model_config = False
        return generated

    def _output_length(self, generated: torch.Tensor, gen_kwargs: dict[str, Any], prompt_length: int) -> int:
        """The length every batch's predictions are padded to: what `generate()` may produce at most."""
        config = self.model.generation_config
        max_new_tokens, max_length = gen_kwargs.get("max_new_tokens"), gen_kwargs.get("max_length")
        if max_new_tokens is None and max_length is None:
            max_new_tokens, max_length = config.max_new_tokens, config.max_length
        if max_length is None and max_new_tokens is None:
            max_length = config._get_default_generation_params()["max_length"]
        if max_new_tokens is not None:
            if self.model.config.is_encoder_decoder:
                return max(generated.shape[-1], max_new_tokens + 1)  # + the decoder start token
            return max(generated.shape[-1], (self.args.generation_prompt_length or prompt_length) + max_new_tokens)
        return max(generated.shape[-1], max_length)
