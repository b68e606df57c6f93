"""`IPUTrainer`: `transformers.Trainer` running the engine, through narrow hooks (no fork).

What changes against `transformers.Trainer`:
- the model is pipelined and parallelized as the `IPUConfig` says (`self.pipelined`); `self.model` stays the
  stock model, so checkpoints are the stock `transformers` layout, plus `ipu_config.json`;
- `gradient_accumulation_steps` is the config's unless given explicitly; precision and loss scaling are the
  engine's (`training_step` and `prediction_step`), so fp16 has static or dynamic loss scaling on any device;
- loaders have static shapes: training drops the incomplete last batch, evaluation hands over
  `per_device_eval_batch_size x inference_device_iterations` samples per host call and, with
  `pad_on_batch_axis`, pads the last batch to that size and drops the padded rows from the predictions;
  right-padded token batches are evaluated at the smallest sequence bucket that holds them (`trim_to_bucket`).
`trainer.args` is the user's `IPUTrainingArguments`, never written: where `Trainer` must read another value for
one call (a loader's static batch, the micro-batches of replicas run in turn), it reads a scoped copy
(`TrainerPrivateHooks._scoped_args`). Everything else (callbacks, logging, TensorBoard, tqdm, evaluate/predict,
checkpoints, resume) is `Trainer`'s.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.utils.deprecation import deprecate_kwarg

from ..config import IPUConfig
from ..config_validation import check_sequence_buckets
from ..errors import SkippedStepsError
from ..files import write_text_atomic
from ..models.layout import layers_per_stage
from ..models.pipelined import to_pipelined
from ..models.tensor_parallel import tensor_parallel_plan
from ..runtime.devices import default_device
from ..runtime.distributed import check_ranks_agree, release_process_group_at_exit, replicas_per_process, world_size
from ..runtime.engine import Engine
from ..runtime.host_memory import keep_freed_host_memory
from ..runtime.inference.runner import buckets_within, trim_to_bucket
from ..runtime.layouts import ModelParts, SaveHooks, choose_layout
from ..runtime.offload import HostOffloadedOptimizer
from ..runtime.optimizers import Lamb
from ..runtime.sharding import ShardedOptimizer
from ..runtime.step import TrainingStep, run_micro_batch
from ..runtime.tensor_parallel import step_mixed_groups_tensor_by_tensor
from .callbacks import CompileOnly, GatherShardedOptimizer, SkipOnOverflow, StepTimer
from .checkpoints import (
    MarkCheckpointComplete,
    check_run_identity,
    discard_checkpoints,
    new_run_id,
    reports_full_disk,
    resolve_resume,
    run_identity,
)
from .compat import TrainerPrivateHooks
from .label_check import UsedLabelWatch, ZeroLossWatch, check_some_label_used
from .nonfinite import EvalLossWatch, nonfinite_cause
from .static_batch import pad_to_static_batch, select_rows
from .training_args import IPUTrainingArguments

logger = logging.getLogger(__name__)

LOSS_SCALER_FILE = "loss_scaler.json"


class IPUTrainer(TrainerPrivateHooks):
    """`transformers.Trainer` with an `IPUConfig`.

    Args:
        model (`transformers.PreTrainedModel`): a model of a registered class (see `registered_classes()`).
        ipu_config (`IPUConfig`, *optional*): the execution configuration; defaults to the one named by
            `args.ipu_config_name` (or `IPUConfig()`), with the arguments' overrides applied.
        args (`IPUTrainingArguments`): the training arguments.
        eval_data_collator (`Callable`, *optional*): the collator of evaluation and prediction batches, as in
            Optimum Graphcore; defaults to `data_collator`.
        kwargs: everything else `transformers.Trainer` takes (datasets, collator, `processing_class`,
            `compute_metrics`, callbacks, ...). `tokenizer=` (Optimum Graphcore's, and `transformers` 4's) is
            read as `processing_class`, with `transformers`' deprecation message.
    """

    @deprecate_kwarg("tokenizer", new_name="processing_class", version="6.0.0", raise_if_both_names=True)
    def __init__(
        self,
        model: nn.Module,
        ipu_config: IPUConfig | None = None,
        args: IPUTrainingArguments | None = None,
        eval_data_collator: Callable[[list[Any]], dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        # The order matters: Trainer is built around the pipelined model (the layout is chosen first: Trainer moves
        # the model to its device through it); the processes agree before any collective; the layout is applied then
        # (the pipeline split, then sharding), and its engine drives the training steps.
        args = self._checked_arguments(ipu_config, args)
        self.ipu_config = args.load_ipu_config(ipu_config)
        self.pipelined = to_pipelined(model, self.ipu_config, parallelize=True)
        self.eval_buckets, self._buckets_said = self._configured_eval_buckets(), False
        self.eval_data_collator = eval_data_collator
        self.layout = choose_layout(self.ipu_config, fsdp=bool(args.fsdp), schedule=args.pipeline_schedule)
        super().__init__(model=model, args=args, **kwargs)
        self.engine: TrainingStep = self._build_engine()
        if self.engine.device.type == "cpu":  # each step's activations not faulted in again (1.16x a MiniLM step)
            keep_freed_host_memory()
        self._nonfinite_loss = torch.zeros((), dtype=torch.bool, device=self.engine.device)
        self._label_watch = UsedLabelWatch(enabled=False)  # armed by train()
        self._zero_loss_watch = ZeroLossWatch(enabled=False)  # armed by train()
        self._eval_loss_watch = EvalLossWatch()
        self._loss_shifts_labels = self._shifts_labels(model)  # Trainer's own, which its count of loss items reads
        self.run_record: dict[str, Any] | None = None  # the run id and identity written into checkpoint markers
        self._check_processes_agree()
        # what training_step drives (the step protocol): stages on separate processes have their own engine
        self.engine = self.layout.apply(self._model_parts(model), self.engine, self.accelerator)
        self.sharded_optimizer, self.offload_optimizer = self._optimizer_placement()
        self.step_timer = StepTimer()
        self.pending_rotation: tuple[str, int] | None = None  # (run folder, save_total_limit): rotated on marking
        self._add_callbacks(model)
        self._report_setup()

    # ------------------------------------------------------------------ set-up (in the order __init__ runs it)
    @staticmethod
    def _checked_arguments(ipu_config: Any, args: IPUTrainingArguments | None) -> IPUTrainingArguments:
        """The training arguments, `IPUTrainingArguments(output_dir="trainer_output")` when not given; a
        `TypeError` for arguments given in the place of the config, or of `transformers.TrainingArguments`."""
        if isinstance(ipu_config, TrainingArguments):
            raise TypeError(
                "IPUTrainer(model, ipu_config, args, ...): training arguments were given as `ipu_config`; "
                "pass them as `args=` (the IPU config may be left out: `args.ipu_config_name` names it)"
            )
        if args is None:
            args = IPUTrainingArguments(output_dir="trainer_output")
        if not isinstance(args, IPUTrainingArguments):
            raise TypeError(f"IPUTrainer needs IPUTrainingArguments, got {type(args).__name__}")
        return args

    def _configured_eval_buckets(self) -> list[int] | None:
        """The config's `inference_parallelize_kwargs["sequence_buckets"]`, sorted and checked (None when not set:
        `default_buckets` of each batch's width)."""
        buckets = self.ipu_config.value("parallelize_kwargs", inference=True).get("sequence_buckets")
        name = "inference_parallelize_kwargs.sequence_buckets"
        return None if buckets is None else check_sequence_buckets(buckets, name)

    def _build_engine(self) -> Engine:
        """The single-process engine: the arguments' precision, loss scaling and clipping. Under `--torch_compile`
        it keeps the compiled graphs in the config's `executable_cache_dir`; `Trainer` compiles the model it runs
        (through accelerate), the engine's own forward stays eager."""
        args = self.args
        engine = Engine(
            self.pipelined,
            self.ipu_config,
            precision=args.precision(args.device.type),
            loss_scaling=args.loss_scaling,
            max_grad_norm=args.max_grad_norm,
            device=args.device,
        )
        engine.loss_scaler.max_consecutive_overflows = args.max_consecutive_skipped_steps
        if args.torch_compile:
            engine.cache_compiled_graphs()
        return engine

    def _model_parts(self, model: nn.Module) -> ModelParts:
        """What the layout is applied to: the stock model and its plan's facts (the layouts never read a plan)."""
        pipelined, plan = self.pipelined, self.pipelined.plan
        cut_layers = len(pipelined.layer_paths())
        return ModelParts(
            model=model,
            runner=pipelined,
            stage_cut=pipelined.stage_cut,
            counts=layers_per_stage(self.ipu_config, cut_layers, inference=False),
            layer_paths=pipelined.layer_paths(),
            name=type(pipelined.model).__name__,
            process_stages_refusal=plan.process_stages_refusal(pipelined.model),
            required_inputs=tuple(plan.process_stage_inputs),
            custom_loss=getattr(self, "compute_loss_func", None) is not None,
            loss_shifts_labels=self._loss_shifts_labels,
            vocabulary_loss=plan.loss_kind(pipelined.class_name) or "",
            tensor_parallel_plan=functools.partial(tensor_parallel_plan, pipelined),
        )

    def _shifts_labels(self, model: nn.Module) -> bool:
        """Whether the loss averages `labels[..., 1:]` (a causal LM: position t predicts t + 1). `Trainer` reads it
        from `loss_type`, unset for GPT-2's head, whose `num_items_in_batch` then counted position 0 (a loss 5/6 of
        the mean on 6-token rows); the stage plan knows it there too. Read before any sharding renames the class."""
        # the stock class's name (`pipelined.class_name`): a peft wrapper's class is not the one the plan knows
        return self._loss_shifts_labels or self.pipelined.plan.loss_kind(self.pipelined.class_name) == "causal"

    def _check_processes_agree(self) -> None:
        """Under torchrun: the process group is released at exit, and every process must have been given the same
        config and run (the same identity), checked before any other collective."""
        if world_size() > 1:
            release_process_group_at_exit()
            check_ranks_agree(self.ipu_config.to_json_string() + json.dumps(self._run_identity(), sort_keys=True))

    def _optimizer_placement(self) -> tuple[bool, bool]:
        """Where the optimizer state lives: sharded over the replicas (`replicated_tensor_sharding`, ZeRO-1; not
        under `--fsdp`, which shards it already), and/or in host memory (`optimizer_state_offchip`, on an
        accelerator and unsharded only). Returns `(sharded, offloaded)`."""
        sharded = self.ipu_config.value("replicated_tensor_sharding") and self.layout.optimizer_state_shardable()
        offload = bool(self.ipu_config.value("optimizer_state_offchip"))
        if offload and self.args.device.type == "cpu":
            logger.info("optimizer_state_offchip: on a CPU the optimizer state is in host memory already")
            offload = False
        if offload and sharded:
            logger.warning("optimizer_state_offchip with replicated_tensor_sharding: the state is sharded, on device")
            offload = False
        return sharded, offload

    def _add_callbacks(self, model: nn.Module) -> None:
        """The callbacks of the set-up, in this order: the sharded optimizer's gather before a save, the step timer,
        the checkpoint marker, and `--compile_only`'s stop after the first step."""
        if self.sharded_optimizer:
            self.add_callback(GatherShardedOptimizer(self))
        self.add_callback(self.step_timer)
        self.add_callback(MarkCheckpointComplete(self))
        if self.args.compile_only:
            if not self.args.torch_compile:
                logger.warning("--compile_only without --torch_compile: there is nothing to compile; one step runs")
            self.add_callback(CompileOnly(model))

    def _report_setup(self) -> None:
        """The layout and precision, said once; `output_mode`, which has no effect here, named."""
        logger.info("IPUTrainer: %s, precision %s", self.pipelined.describe_layout(), self.engine.precision)
        if self.ipu_config.output_mode not in ("final", "default"):
            logger.warning(
                "output_mode=%r has no effect here: it chose what an IPU host call returned of its iterations' losses; "
                "IPUTrainer logs each optimizer step's loss, as Trainer does",
                self.ipu_config.output_mode,
            )

    @property
    def eval_batch_per_call(self) -> int:
        """Samples per evaluation host call in this process: the micro-batch x the layout's device iterations
        (`inference_device_iterations`; several a stage by default when stages run on processes) x the inference
        replicas this process runs in turn (under torchrun, each process is a replica)."""
        replicas_here = replicas_per_process(self.ipu_config, inference=True)
        return self.args.eval_batch_size * replicas_here * self.layout.eval_device_iterations()

    def _loader_args(self) -> dict[str, Any]:
        """What every loader of this trainer reads differently from the user's arguments."""
        return {"dataloader_pin_memory": False} if default_device().type == "cpu" else {}  # on a CPU it only warns

    def _log_effective_batch(self) -> None:
        """Samples per optimizer step, said once as training starts (the number a user compares runs by)."""
        config, micro = self.ipu_config, self.args.per_device_train_batch_size
        accumulation, replicas = config.gradient_accumulation_steps, config.value("replication_factor")
        per_step = micro * accumulation * replicas
        iterations = config.value("device_iterations")
        logger.info(
            "Effective batch: micro-batch %d x gradient_accumulation_steps %d x replicas %d = %d samples per optimizer "
            "step%s",
            micro,
            accumulation,
            replicas,
            per_step,
            f" ({iterations} steps, {per_step * iterations} samples per host call)" if iterations > 1 else "",
        )

    # ------------------------------------------------------------------ training
    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """One micro-batch through the training engine's step protocol (`optimum_ipu.runtime.step`), whichever
        engine it is: `micro_batch` (autocast, weighted loss, scaled backward; queued, with stages on separate
        processes), and after the last micro-batch of an optimizer step `finish_step` (the pipeline schedule runs;
        gradients are unscaled, clipped and checked: an overflow drops them and the step is skipped). `Trainer`'s
        loop then steps the optimizer and the LR schedule.

        With `num_items_in_batch` (`Trainer`'s count of labelled items over the step's micro-batches), each
        micro-batch weighs its mean loss by its own items over that count: a token-level loss under accumulation
        with uneven padding is the step's token mean, as `transformers.Trainer` computes it, and a loss that is a
        mean over examples (which `Trainer` would not divide by the accumulation) gets one big batch's weights.
        """
        model.train()
        inputs = self._prepare_inputs(inputs)
        runner = self.layout.training_runner(model)  # the pipelined wrapper in one process (serialized heads)
        weight = self._micro_batch_weight(inputs, num_items_in_batch)  # before compute_loss, which may pop labels
        self._label_watch.see(inputs)
        self.layout.before_micro_batch(last=self.accelerator.sync_gradients)  # --fsdp: reduce-scatter once per step
        loss, finished = run_micro_batch(  # the step's finish after its last micro-batch, numbered as logs count
            self.engine,
            inputs,
            weight,
            finish=self.accelerator.sync_gradients,
            compute_loss=lambda batch: self.compute_loss(runner, batch),
            step=self.state.global_step + 1,
        )
        self._zero_loss_watch.see(loss)
        # Kept on the device and checked once per optimizer step: no host sync per micro-batch.
        self._nonfinite_loss = self._nonfinite_loss | ~torch.isfinite(loss)
        if finished is not None:
            loss = loss + finished.loss
            self._check_finite_loss(self._nonfinite_loss | ~torch.isfinite(loss), inputs)
            self._nonfinite_loss = torch.zeros((), dtype=torch.bool, device=loss.device)
            last = self.state.global_step + 1 >= self.state.max_steps
            self._label_watch.step_done(last=last)
            self._zero_loss_watch.see(loss)
            self._zero_loss_watch.step_done(last=last, said=self._label_watch.warned)
        return loss

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        """`Trainer`'s, as the layout reads them (with stages on separate processes the replica's last stage's
        micro-batches on every stage), counted after they are shared."""
        batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
        shared = self.layout.same_batches(batches)
        return (batches, count) if shared is batches else (shared, self._get_num_items_in_batch(shared, device))

    def _micro_batch_weight(self, inputs: dict[str, Any], num_items_in_batch: Any) -> float | torch.Tensor:
        """This micro-batch's share of its optimizer step's loss (see `training_step`)."""
        if num_items_in_batch is None:
            return 1 / self.current_gradient_accumulation_steps
        # The items this micro-batch's mean loss averages, counted by Trainer's rule (`_get_num_items_in_batch`, written
        # out: across processes it all-gathers, a collective per micro-batch). Mean x items / step's count = its token
        # sum over Trainer's count: the stock number, whether or not the model itself takes `num_items_in_batch`.
        labels = inputs.get("shift_labels")
        if labels is None:
            labels = inputs["labels"][..., 1:] if self._loss_shifts_labels else inputs["labels"]
        weight = labels.ne(-100).sum() / num_items_in_batch
        if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
            weight = weight * self.accelerator.num_processes  # the count is over every process; DDP averages
        return weight

    def _check_finite_loss(self, nonfinite: torch.Tensor, inputs: dict[str, Any]) -> None:
        if self.args.stop_on_nan and bool(nonfinite):
            where = f"at step {self.state.global_step + 1} (epoch {self.state.epoch:.2f})"
            cause = nonfinite_cause(inputs)  # the data's fault is not the learning rate's
            fix = cause or "lower the learning rate, use bf16 or loss scaling"
            raise FloatingPointError(
                f"the loss is NaN or infinite {where}; {fix}, or pass --stop_on_nan false to train on"
            )

    def get_total_train_batch_size(self, args: TrainingArguments) -> int:
        return self.layout.samples_per_step(super().get_total_train_batch_size(args))

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: TrainingArguments, model: nn.Module | None = None) -> tuple[Any, Any]:
        """`--lamb` selects LAMB (with `Trainer`'s weight-decay groups), `--lamb_no_bias_correction` LAMB without
        bias correction of the moments; anything else is `Trainer`'s choice."""
        if getattr(args, "lamb", False) or getattr(args, "lamb_no_bias_correction", False):
            kwargs = {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
            kwargs["bias_correction"] = not getattr(args, "lamb_no_bias_correction", False)
            return Lamb, kwargs
        return Trainer.get_optimizer_cls_and_kwargs(args, model)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """`Trainer`'s optimizer; with `replicated_tensor_sharding` over several replicas, its state is sharded
        over them (ZeRO-1, `ShardedOptimizer`), same numbers, less memory each; with `optimizer_state_offchip`
        on an accelerator, its state and fp32 master weights stay in host memory (`HostOffloadedOptimizer`)."""
        if self.optimizer is not None or not (self.sharded_optimizer or self.offload_optimizer):
            optimizer = super().create_optimizer(model)
            if step_mixed_groups_tensor_by_tensor(getattr(optimizer, "optimizer", optimizer)):
                logger.info(
                    "optimizer groups mixing split and whole parameters step tensor by tensor (no fused kernel)"
                )
            return optimizer
        # Trainer's weight-decay groups, rebuilt here: Trainer would call a non-Optimizer class as a factory.
        opt_model = self.model if model is None else model
        decay = set(self.get_decay_parameter_names(opt_model))
        named = [(n, p) for n, p in opt_model.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        ]
        optimizer_cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        if self.sharded_optimizer:
            self.optimizer = ShardedOptimizer(groups, optimizer_class=optimizer_cls, **kwargs)
        else:
            self.optimizer = HostOffloadedOptimizer(groups, optimizer_cls, **kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if not isinstance(scheduler, SkipOnOverflow):
            self.lr_scheduler = SkipOnOverflow(scheduler, self.engine)
        return self.lr_scheduler

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        dataset = self.train_dataset
        if dataset is not None and hasattr(dataset, "__len__"):
            factor = self.ipu_config.batch_size_factor(for_inference=False)
            per_call = self.args.per_device_train_batch_size * factor
            if len(dataset) < per_call:
                logger.warning(
                    "the training set has %d samples, fewer than one host call takes (%d = micro-batch %d x %d): "
                    "no full optimizer step can run; lower the batch size, gradient_accumulation_steps or "
                    "device_iterations",
                    len(dataset),
                    per_call,
                    self.args.per_device_train_batch_size,
                    factor,
                )
        # Static shapes: every training batch is full, so each graph compiles once. Evaluation keeps every
        # sample (`pad_on_batch_axis` pads its last batch instead).
        with self._scoped_args(dataloader_drop_last=True, **self._loader_args()):
            return self.layout.train_loader(super().get_train_dataloader())

    def _run_identity(self) -> dict[str, Any]:
        dataset = self.train_dataset
        samples = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
        stock = getattr(self.model, "model", self.model)  # a pipelined model's stock one
        config = getattr(stock, "config", None) or getattr(self.model, "config", None)
        return run_identity(self.args, self.ipu_config, self.engine.precision, samples, config)

    def _start_run(self, resume_from_checkpoint: str | bool | None) -> str | None:
        """Resolve and check the checkpoint to resume from (None: a fresh run, whose `--overwrite_output_dir`
        discards an earlier run's checkpoints now, before the first step) and set the run recorded in markers."""
        checkpoint = resolve_resume(resume_from_checkpoint, self.args.output_dir)
        identity = self._run_identity()
        per_call = self.args.per_device_train_batch_size * self.ipu_config.batch_size_factor(for_inference=False)
        if identity["train_samples"] is not None and identity["train_samples"] < per_call:
            # transformers would fail later, saying only that max_steps must be positive
            raise ValueError(
                f"the training set has {identity['train_samples']} samples, fewer than one host call takes ({per_call} "
                f"= --per_device_train_batch_size {self.args.per_device_train_batch_size} x replicas x accumulation x "
                "device iterations); lower the batch size or gradient_accumulation_steps, or give more data"
            )
        read = check_some_label_used(self.train_dataset)  # every label -100: loss 0.0 and nothing learned, exit 0
        one_process = self.accelerator.num_processes == 1
        self._label_watch = UsedLabelWatch(enabled=one_process and not read)  # data prepared on the fly
        # a warning: every process's loss is its own (but a stage's of a process pipeline, which is not the loss)
        watch_loss = self.layout.reports_model_loss and self.is_world_process_zero()
        self._zero_loss_watch = ZeroLossWatch(enabled=watch_loss)
        run_id = check_run_identity(checkpoint, identity) if checkpoint is not None else None
        if checkpoint is None and self.args.overwrite_output_dir and self.args.should_save:
            removed = discard_checkpoints(self.args.output_dir)
            if removed:
                logger.warning("--overwrite_output_dir: removed %s of an earlier run", ", ".join(removed))
        self.accelerator.wait_for_everyone()  # nobody saves before the earlier run's checkpoints are gone
        self.run_record = {"id": run_id or new_run_id(), "identity": identity}
        if checkpoint is not None and os.path.isfile(os.path.join(checkpoint, LOSS_SCALER_FILE)):
            path = os.path.join(checkpoint, LOSS_SCALER_FILE)
            with open(path, encoding="utf-8") as f:
                self.engine.loss_scaler.load_state_dict(json.load(f), source=path)
        return checkpoint

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        """`Trainer.train`, resuming only from complete, whole checkpoints of the same run, restoring the fp16 loss
        scale, and refusing to exit normally from an fp16 run that skipped every step.

        `resume_from_checkpoint=True` takes the newest `checkpoint-N` of `output_dir` that is marked complete and
        whose files match their sizes and hashes, or that a plain `transformers.Trainer` wrote (no marker) and whose
        files load, said in one line (others are named and skipped); a folder given by path must be whole too. The
        arguments that shape training must be those recorded in the checkpoint (`checkpoints.run_identity`).

        With `torch_compile`, `train_samples_per_second` and `train_steps_per_second` exclude the compilation
        of the first step, reported as `train_compile_time`; `train_runtime` stays the wall-clock time.
        """
        resume_from_checkpoint = self._start_run(resume_from_checkpoint)
        self._log_effective_batch()
        scaler = self.engine.loss_scaler
        steps_before, overflows_before = scaler.steps, scaler.overflows
        # Replicas that share this process run in turn: their micro-batches accumulate into the same step.
        micro_batches = self.ipu_config.gradient_accumulation_steps * replicas_per_process(self.ipu_config)
        with self._scoped_args(gradient_accumulation_steps=micro_batches):
            output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        steps, skipped = scaler.steps - steps_before, scaler.overflows - overflows_before
        if scaler.enabled and steps and skipped == steps:
            raise SkippedStepsError(
                f"fp16: every optimizer step of this run ({steps}) overflowed and was skipped "
                f"(loss scale now {scaler.scale:g}): no weight changed. Lower --loss_scaling, use --auto_loss_scaling, "
                "check the data and learning rate for inf/NaN, or train in bf16/fp32"
            )
        compile_seconds = self.step_timer.compile_seconds() if self.args.torch_compile else None
        metrics = output.metrics
        if compile_seconds is not None and metrics.get("train_runtime", 0) > compile_seconds:
            speedup = metrics["train_runtime"] / (metrics["train_runtime"] - compile_seconds)
            for key in ("train_samples_per_second", "train_steps_per_second"):
                if key in metrics:
                    metrics[key] = round(metrics[key] * speedup, 3)
            metrics["train_compile_time"] = round(compile_seconds, 4)
        return output

    # ---------------------------------------------------------------- evaluation
    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
        """`Trainer`'s, run as the layout says (its gather of predictions, the arguments it reads differently)."""
        scope = self.layout.evaluation_scope(self.args.eval_batch_size)
        gather, self.gather_function = self.gather_function, scope.gather or self.gather_function
        self._eval_loss_watch.start()
        try:
            with self._scoped_args(**scope.args):
                output = super().evaluation_loop(*args, **kwargs)
            if self.args.stop_on_nan:  # a NaN eval_loss beside a plausible metric, exit 0: the data's or the model's
                prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
                one_process = self.args.world_size == 1
                self._eval_loss_watch.check(output.metrics, prefix, self.eval_batch_per_call, one_process)
            return output
        finally:
            self.gather_function = gather
            self.layout.after_evaluation()

    def _check_eval_rows(self, dataset: Any, what: str) -> None:
        """With `dataloader_drop_last`, a set smaller than one host call would be dropped whole: `evaluate()` returned
        no metric, without a word (training refuses the same case)."""
        rows = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
        if self.args.dataloader_drop_last and rows is not None and rows < self.eval_batch_per_call:
            raise ValueError(
                f"the {what} set has {rows} samples, fewer than one host call takes ({self.eval_batch_per_call} = "
                f"--per_device_eval_batch_size {self.args.per_device_eval_batch_size} x inference device iterations x "
                "replicas), and --dataloader_drop_last drops it whole: lower the batch size, give more data, or pass "
                "--dataloader_drop_last false"
            )

    def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
        """`Trainer`'s, handing over `eval_batch_per_call` samples per host call, with `eval_data_collator`."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str) and isinstance(self.eval_dataset, dict):  # a name among the evaluation sets
            dataset = self.eval_dataset.get(dataset)
        if not isinstance(dataset, (dict, str)):  # a dict of sets is evaluated set by set, each through here again
            self._check_eval_rows(dataset, "evaluation")
        with self._scoped_args(per_device_eval_batch_size=self.eval_batch_per_call, **self._loader_args()):
            with self._scoped_collator(self.eval_data_collator):
                return self.layout.eval_loader(super().get_eval_dataloader(eval_dataset))

    def get_test_dataloader(self, test_dataset: Any) -> torch.utils.data.DataLoader:
        """`Trainer`'s, handing over `eval_batch_per_call` samples per host call, with `eval_data_collator`."""
        self._check_eval_rows(test_dataset, "prediction")
        with self._scoped_args(per_device_eval_batch_size=self.eval_batch_per_call, **self._loader_args()):
            with self._scoped_collator(self.eval_data_collator):
                return self.layout.eval_loader(super().get_test_dataloader(test_dataset))

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """`Trainer.prediction_step` in the inference layout and the engine's precision; with `pad_on_batch_axis`
        a last, smaller batch is padded to the static batch size and the padded rows are dropped from logits and
        labels. Right-padded token batches run at the smallest sequence bucket that holds their longest row
        (`inference_parallelize_kwargs["sequence_buckets"]`, else `default_buckets` of the batch's width;
        `optimum_ipu.runtime.inference.runner.trim_to_bucket` says which batches are left whole): their logits and
        labels are that wide, and `Trainer` pads them with -100 when it concatenates batches."""
        real = None
        if self.args.pad_on_batch_axis:
            inputs, real = pad_to_static_batch(inputs, self.eval_batch_per_call)
        trimmed = trim_to_bucket(inputs, self.eval_buckets)
        if trimmed is not inputs and not self._buckets_said:
            width = inputs["attention_mask"].shape[1]
            logger.info(
                "evaluation: each batch runs at the smallest sequence bucket that holds its longest row (%s for %d "
                "columns; set by inference_parallelize_kwargs.sequence_buckets)",
                buckets_within(width, self.eval_buckets),
                width,
            )
            self._buckets_said = True
        inputs = trimmed
        self.layout.before_prediction_step(prediction_loss_only)
        with self.engine.autocast():
            loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        self._eval_loss_watch.see(loss, inputs)
        if real is not None and not bool(real.all()):
            real = real.to(self.args.device)
            logits = select_rows(logits, real)
            labels = select_rows(labels, real)
        return loss, logits, labels

    # -------------------------------------------------------------------- saving
    def _save_model_files(self, folder: str) -> None:
        """What `Trainer._save` writes besides the weights: the config (and generation config), the processing class
        and the training arguments."""
        self.model.config.save_pretrained(folder)
        if getattr(self.model, "generation_config", None) is not None and self.model.can_generate():
            self.model.generation_config.save_pretrained(folder)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(folder)
        torch.save(self.args, os.path.join(folder, TRAINING_ARGS_NAME))

    def _write_adapters(self, state_dict: dict[str, torch.Tensor], folder: str) -> None:
        """peft's adapter files of a model whose stages are held apart (gathered whole by the layout), written with
        the wrapper's own `save_pretrained`, as `Trainer` writes them in one process."""
        self.model.save_pretrained(folder, state_dict=state_dict)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(folder)
        torch.save(self.args, os.path.join(folder, TRAINING_ARGS_NAME))

    @reports_full_disk
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the stock model (`transformers` layout) and `ipu_config.json` beside it; in checkpoints also
        the fp16 loss scale, so a resumed run continues with it."""
        hooks = SaveHooks(  # the layout writes the tensors (every process calls it), Trainer's writers the rest
            should_save=self.args.should_save,
            stock=functools.partial(super().save_model, output_dir, _internal_call),
            write_state_dict=functools.partial(self.save_state_dict, output_dir),
            write_model_files=self._save_model_files,
            write_adapters=self._write_adapters,
        )
        self.layout.save_model(output_dir or self.args.output_dir, hooks)
        if not self.args.should_save:
            return
        output_dir = output_dir or self.args.output_dir
        self.ipu_config.save_pretrained(output_dir)
        if self.engine.loss_scaler.enabled:
            write_text_atomic(
                os.path.join(output_dir, LOSS_SCALER_FILE), json.dumps(self.engine.loss_scaler.state_dict())
            )
