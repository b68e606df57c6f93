"""`IPUTrainingArguments`: `transformers.TrainingArguments` plus the fields of Optimum Graphcore's.

Also brings back two arguments that `transformers` 5 removed and the reference SQuAD command still uses,
with their old meaning: `warmup_ratio` and `overwrite_output_dir`.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from functools import cached_property

from transformers import TrainingArguments

from ..config import IPUConfig
from ..errors import short_repr
from ..runtime.devices import cpu_supports_bf16, default_device, supports_bf16
from ..runtime.distributed import init_cpu_process_group, set_default_group_timeout, start_heartbeat, world_size
from ..runtime.precision import check_loss_scale
from ..topology import check_schedule, replication_for_devices
from .checkpoints import last_complete_checkpoint, resolve_resume

logger = logging.getLogger(__name__)


def _pod_size(pod_type: str) -> int:
    """`"pod16"` -> 16, as Optimum Graphcore read `--pod_type` (`int(pod_type.strip("pod"))`)."""
    digits = str(pod_type).strip().lower().removeprefix("pod")
    if not digits.isdigit() or int(digits) < 1:
        raise ValueError(f"--pod_type: got {short_repr(pod_type)}; expected podN such as pod16 (better: --n_ipu 16)")
    return int(digits)


PIPELINE_SCHEDULES = ("1F1B", "GPipe")
# Optimum Graphcore's names; "batch" (this library's name for "sync" before 0.2) is still read as "sync".
DATALOADER_MODES = ("sync", "async", "async_rebatched")


@dataclass
class IPUTrainingArguments(TrainingArguments):
    r"""
    `transformers.TrainingArguments` with the arguments of Optimum Graphcore's `IPUTrainingArguments`.

    `per_device_train_batch_size` is the micro-batch of one device slot; samples per optimizer step are
    that times `gradient_accumulation_steps` times `replication_factor` (logged when training starts).

    What these arguments leave to `transformers` and what they take over: precision (`fp16`, `bf16`, the loss
    scale) is the engine's autocast, so `mixed_precision` is `"no"` for `accelerate`; `--fsdp` is this library's
    sharding over replicas (and stages), not `accelerate`'s FSDP plugin (`fsdp_plugin_args` is `None`);
    `--deepspeed` is refused. Every field keeps the value the user gave, except where an Optimum Graphcore
    argument is translated into `transformers`' own (`warmup_ratio`, `dataloader_mode`, `lamb_no_bias_correction`)
    or has nothing to act on (`--fsdp` in one process).

    Args:
        ipu_config_name (`str`, *optional*):
            Folder, JSON file or id of the `IPUConfig` (`--ipu_config_name=./` reads `./ipu_config.json`).
        ipu_config_overrides (`str`, *optional*):
            `"key=value,..."` applied with `IPUConfig.update_from_string`.
        n_ipu (`int`, *optional*):
            Devices of the pod: sets `replication_factor = n_ipu // ipus_per_replica` and resolves per-pod values.
        loss_scaling (`float`, *optional*):
            Static fp16 loss scale (dynamic from there with `auto_loss_scaling`). Unused in bf16 and fp32.
        auto_loss_scaling (`bool`, *optional*, defaults to `False`):
            Dynamic loss scaling; sets the config's `auto_loss_scaling`.
        fp32 (`bool`, *optional*, defaults to `False`):
            Train in full precision even where half precision is the default (CUDA with bf16 support).
        gradient_accumulation_steps (`int`, *optional*):
            Micro-batches per optimizer step. Defaults to the IPU config's `gradient_accumulation_steps`; given
            explicitly, it wins over the config (said in one line when they differ).
        dataloader_mode (`str`, *optional*, defaults to `"sync"`):
            As in Optimum Graphcore: `"sync"` loads each batch when it is needed (in `dataloader_num_workers`
            worker processes if any); `"async"` loads ahead in background workers (at least one, kept alive
            across epochs, `dataloader_prefetch_factor` batches each); `"async_rebatched"` is `"async"` where
            each worker loads a part of the batch and the parts are joined (here: the same as `"async"`, since
            a PyTorch worker yields whole batches).
        pad_on_batch_axis (`bool`, *optional*, defaults to `False`):
            Pad a last incomplete batch to the full static shape instead of dropping it in training.
        compile_only (`bool`, *optional*, defaults to `False`):
            Compile the graphs (filling `executable_cache_dir`) and stop before training.
        lamb (`bool`, *optional*, defaults to `False`):
            Use the LAMB optimizer instead of AdamW.
        lamb_no_bias_correction (`bool`, *optional*, defaults to `False`):
            Use LAMB without Adam's bias correction of the moments (implies `lamb`), as in Optimum Graphcore.
        warmup_ratio (`float`, *optional*, defaults to 0.0):
            Share of the training steps used for linear warm-up (the `transformers` 4 argument). Ignored when
            `warmup_steps` is set.
        overwrite_output_dir (`bool`, *optional*, defaults to `False`):
            Allow training into a non-empty `output_dir` (the `transformers` 4 argument); without it, the example
            scripts resume from the last checkpoint there or stop with a clear error.
        stop_on_nan (`bool`, *optional*, defaults to `True`):
            Stop training with an error naming the step when a loss is NaN or infinite (an fp16 gradient overflow
            is not a NaN loss: loss scaling skips that step). `False` trains on.
        logging_nan_inf_filter (`bool`, *optional*, defaults to `False`):
            As in `transformers` (where it defaults to `True`): replace NaN/inf losses in the logs by the running
            mean. Off here, so a NaN is never hidden.
        pipeline_schedule (`str`, *optional*, defaults to `"1F1B"`):
            The schedule of pipeline stages on separate processes (`torchrun`, `ipus_per_replica` > 1): `"1F1B"`
            (one forward, one backward: fewer activations alive) or `"GPipe"` (all forwards, then all backwards),
            one stage per process; or `"Interleaved1F1B"` or `"ZeroBubble"` (torch's interleaved zero-bubble
            schedule: each backward split into its input and weight parts), which also run several stages per process
            when `layers_per_ipu` is longer than the processes of a replica (smaller bubble). Same numbers every way.
            With one process the stages run in turn and this has no effect.
        ddp_timeout (`int`, *optional*, defaults to 1800):
            Seconds a process waits in a collective before it gives up, as in `transformers`: a rank that died
            or hangs ends the job within this bound (the rank is named). Applies to gloo on CPUs too, where
            `transformers` drops it. Lower it (e.g. 120) to fail fast once data preparation is cached.
        max_consecutive_skipped_steps (`int`, *optional*, defaults to 50):
            Stop fp16 training with an error naming the loss scale after this many optimizer steps in a row were
            skipped for an overflow (0: no bound). A run whose every step was skipped also ends in that error.
        resume_from_checkpoint (`str` or `bool`, *optional*):
            A checkpoint folder, or `True` (also `"true"` on the command line) for the newest complete one in
            `output_dir`. The folder must be complete and whole, written with the same training arguments.

    Read with their Optimum Graphcore meaning, each with a line saying what to write instead (their commands run
    unchanged):

        pod_type (`str`, *optional*):
            `"pod16"` and the like, Optimum Graphcore's name before `n_ipu`: sets `n_ipu` (16).
        evaluation_strategy (`str`, *optional*):
            The `transformers` 4 name of `eval_strategy`, which it sets.
        push_to_hub_model_id, push_to_hub_organization, push_to_hub_token (`str`, *optional*):
            The `transformers` 4 names that set `hub_model_id` (`organization/model_id`) and `hub_token`.
        group_by_length (`bool`, *optional*, defaults to `False`):
            Sets `train_sampling_strategy="group_by_length"`.
        include_inputs_for_metrics (`bool`, *optional*, defaults to `False`):
            Adds `"inputs"` to `include_for_metrics`.
    """

    ipu_config_name: str | None = field(default=None, metadata={"help": "Folder, JSON file or id of the IPUConfig."})
    ipu_config_overrides: str | None = field(
        default=None, metadata={"help": 'IPUConfig fields to override: "key=value,key=[1 2 -1]".'}
    )
    n_ipu: int | None = field(default=None, metadata={"help": "Devices of the pod (sets replication_factor)."})
    loss_scaling: float | None = field(default=None, metadata={"help": "Static fp16 loss scale."})
    auto_loss_scaling: bool = field(default=False, metadata={"help": "Dynamic fp16 loss scaling."})
    fp32: bool = field(default=False, metadata={"help": "Train in full precision."})
    gradient_accumulation_steps: int | None = field(
        default=None, metadata={"help": "Micro-batches per optimizer step (default: the IPU config's)."}
    )
    dataloader_mode: str = field(default="sync", metadata={"help": f"One of {', '.join(DATALOADER_MODES)}."})
    pad_on_batch_axis: bool = field(default=False, metadata={"help": "Pad the last batch to the static shape."})
    compile_only: bool = field(default=False, metadata={"help": "Compile the graphs and stop."})
    lamb: bool = field(default=False, metadata={"help": "Use the LAMB optimizer."})
    lamb_no_bias_correction: bool = field(
        default=False, metadata={"help": "Use LAMB without bias correction of the moments (implies --lamb)."}
    )
    warmup_ratio: float = field(default=0.0, metadata={"help": "Linear warm-up over this share of the steps."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Train into a non-empty output_dir."})
    stop_on_nan: bool = field(
        default=True, metadata={"help": "Stop when the loss is NaN or infinite, naming the step."}
    )
    logging_nan_inf_filter: bool = field(
        default=False, metadata={"help": "Hide NaN/inf losses from the logs (off: a NaN is never hidden)."}
    )
    pipeline_schedule: str = field(
        default="1F1B",
        metadata={"help": "Pipeline schedule of stages on processes: 1F1B, GPipe, Interleaved1F1B, ZeroBubble."},
    )
    ddp_timeout: int = field(
        default=1800, metadata={"help": "Seconds a process waits on the others (a dead rank ends the job after it)."}
    )
    max_consecutive_skipped_steps: int = field(
        default=50, metadata={"help": "Stop fp16 training after this many skipped (overflowed) steps in a row; 0: off."}
    )
    # Optimum Graphcore's spellings (its IPUTrainingArguments kept transformers 4's), translated in __post_init__
    pod_type: str | None = field(default=None, metadata={"help": "Deprecated: use --n_ipu (pod16 -> --n_ipu 16)."})
    evaluation_strategy: str | None = field(default=None, metadata={"help": "Deprecated: use --eval_strategy."})
    push_to_hub_model_id: str | None = field(default=None, metadata={"help": "Deprecated: use --hub_model_id."})
    push_to_hub_organization: str | None = field(
        default=None, metadata={"help": "Deprecated: use --hub_model_id ORGANIZATION/NAME."}
    )
    push_to_hub_token: str | None = field(default=None, metadata={"help": "Deprecated: use --hub_token."})
    group_by_length: bool = field(
        default=False, metadata={"help": "Deprecated: use --train_sampling_strategy group_by_length."}
    )
    include_inputs_for_metrics: bool = field(
        default=False, metadata={"help": "Deprecated: use --include_for_metrics inputs."}
    )

    def __post_init__(self) -> None:
        self._translate_optimum_graphcore_args()
        self._check_counts()
        self._check_training_length()
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise ValueError(f"--warmup_ratio: got {self.warmup_ratio}; expected a share of the steps in [0, 1]")
        if self.warmup_ratio > 0:
            if self.warmup_steps:
                logger.info(
                    "--warmup_steps %s given: --warmup_ratio %s is ignored", self.warmup_steps, self.warmup_ratio
                )
            else:
                # transformers 5 reads a warmup_steps below 1 as a ratio of the training steps (a ratio of
                # exactly 1 would read as one step: just below it rounds up to all the steps).
                self.warmup_steps = min(self.warmup_ratio, 1.0 - 1e-9)
        check_schedule(self.pipeline_schedule)
        if self.dataloader_mode == "batch":
            self.dataloader_mode = "sync"
        if self.dataloader_mode not in DATALOADER_MODES:
            raise ValueError(
                f"--dataloader_mode: got {self.dataloader_mode!r}; expected one of {', '.join(DATALOADER_MODES)}"
            )
        if self.fp32 and (self.fp16 or self.bf16):
            raise ValueError("--fp32 cannot be combined with --fp16 or --bf16; pick one precision")
        # Values set from Python (not parsed from the command line) are not type-checked by the dataclass.
        if self.loss_scaling is not None and (
            isinstance(self.loss_scaling, bool) or not isinstance(self.loss_scaling, (int, float))
        ):
            raise ValueError(f"--loss_scaling: got {self.loss_scaling!r}; expected a number such as 64")
        if self.n_ipu is not None and (isinstance(self.n_ipu, bool) or not isinstance(self.n_ipu, int)):
            raise ValueError(f"--n_ipu: got {short_repr(self.n_ipu)}; expected the number of devices, an integer >= 1")
        if self.loss_scaling is not None:
            check_loss_scale(self.loss_scaling)  # NaN, inf, <= 0 or absurd scales train nothing
        if self.n_ipu is not None and self.n_ipu < 1:
            raise ValueError(f"--n_ipu: got {self.n_ipu}; expected the number of devices, >= 1")
        self._check_resume()
        if self.deepspeed:
            raise ValueError(
                f"--deepspeed {short_repr(self.deepspeed)}: DeepSpeed is not supported (the engine runs the backward "
                "and optimizer step itself); for sharded parameters use --fsdp, for a sharded optimizer state the IPU "
                "config's replicated_tensor_sharding"
            )
        if self.lamb_no_bias_correction:
            self.lamb = True
        if default_device().type == "cpu":
            # accelerate sets up CPU processes (gloo) under torchrun only when told the job is CPU-only.
            self.use_cpu = True
            if world_size() > 1 and self.ddp_backend is None:
                self.ddp_backend = "gloo"
        if self.dataloader_mode != "sync":
            # loading runs ahead in background workers kept across epochs (poptorch's asynchronous accessor)
            self.dataloader_num_workers = max(1, self.dataloader_num_workers)
            self.dataloader_persistent_workers = True
        accumulation = self.gradient_accumulation_steps
        self.gradient_accumulation_steps = 1 if accumulation is None else accumulation  # transformers needs an int
        super().__post_init__()
        self.accumulation_given = accumulation is not None  # else the IPU config's value (`load_ipu_config`)
        # The engine autocasts and scales the loss: accelerate must not do either a second time.
        self.mixed_precision = "no"
        # --fsdp is realised by IPUTrainer (FSDP2 over replicas and stages), not by accelerate's plugin, which
        # transformers refuses on CPUs and which would wrap the model a second time.
        self.fsdp_plugin_args = None
        if self.fsdp and world_size() == 1:
            logger.warning("--fsdp in one process: the replicas run in turn here, there is nothing to shard over")
            self.fsdp = False  # transformers refuses --fsdp outside a distributed job

    def _translate_optimum_graphcore_args(self) -> None:
        """Optimum Graphcore's (and `transformers` 4's) spellings, read with their meaning there: each sets the
        argument that replaced it here and says so in one line; one that contradicts its replacement is refused."""
        if self.pod_type is not None:
            n_ipu = _pod_size(self.pod_type)
            if self.n_ipu is not None and self.n_ipu != n_ipu:
                raise ValueError(
                    f"--pod_type {self.pod_type} and --n_ipu {self.n_ipu}: they disagree; pass only --n_ipu"
                )
            logger.warning(
                "--pod_type %s is deprecated (as in Optimum Graphcore): read as --n_ipu %d", self.pod_type, n_ipu
            )
            self.n_ipu = n_ipu
        if self.evaluation_strategy is not None:
            strategy = str(self.evaluation_strategy)
            if str(self.eval_strategy) not in ("no", "IntervalStrategy.NO", strategy):
                raise ValueError(
                    f"--evaluation_strategy {strategy} and --eval_strategy {self.eval_strategy}: they disagree; "
                    "pass only --eval_strategy"
                )
            logger.warning("--evaluation_strategy is the transformers 4 name: read as --eval_strategy %s", strategy)
            self.eval_strategy = strategy
        if self.push_to_hub_token is not None:
            logger.warning("--push_to_hub_token is the transformers 4 name: read as --hub_token")
            self.hub_token = self.push_to_hub_token
        if self.push_to_hub_model_id is not None or self.push_to_hub_organization is not None:
            name = self.push_to_hub_model_id or os.path.basename(os.path.normpath(self.output_dir or "."))
            org = self.push_to_hub_organization
            self.hub_model_id = f"{org}/{name}" if org else name
            logger.warning(
                "--push_to_hub_model_id / --push_to_hub_organization are the transformers 4 names: read as "
                "--hub_model_id %s",
                self.hub_model_id,
            )
        if self.group_by_length:
            logger.warning(
                "--group_by_length is the transformers 4 name: read as --train_sampling_strategy group_by_length"
            )
            self.train_sampling_strategy = "group_by_length"
        if self.include_inputs_for_metrics:
            logger.warning(
                "--include_inputs_for_metrics is the transformers 4 name: read as --include_for_metrics inputs"
            )
            self.include_for_metrics = [*(self.include_for_metrics or []), "inputs"]

    def _check_counts(self) -> None:
        """Integers that `transformers` does not check (0 accumulation steps is a ZeroDivisionError mid-run)."""
        minimum = {
            "gradient_accumulation_steps": 1,
            "per_device_train_batch_size": 1,
            "per_device_eval_batch_size": 1,
            "ddp_timeout": 1,
            "max_consecutive_skipped_steps": 0,
        }
        for name, low in minimum.items():
            value = getattr(self, name)
            if name == "gradient_accumulation_steps" and value is None:
                continue  # the IPU config's
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"--{name}: got {short_repr(value)}; expected an integer >= {low}")

    def _check_training_length(self) -> None:
        """A run asked to train must train: `--num_train_epochs 0` (or negative, or not finite) without a positive
        `--max_steps` would end at once with exit 0 having trained nothing."""
        for name in ("learning_rate", "weight_decay", "max_grad_norm", "adam_epsilon", "warmup_ratio"):
            value = getattr(self, name)  # --learning_rate 1e309 is inf: it trained one step, then every loss was NaN
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"--{name}: got {short_repr(value)}; expected a finite number >= 0")
        epochs = self.num_train_epochs
        if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not math.isfinite(epochs):
            raise ValueError(f"--num_train_epochs: got {short_repr(epochs)}; expected a finite number of epochs")
        if self.do_train and self.max_steps <= 0 and epochs <= 0:
            raise ValueError(
                f"--num_train_epochs: got {epochs} with --max_steps {self.max_steps}: nothing would train; pass a "
                "positive number of epochs, or --max_steps N"
            )

    def _check_resume(self) -> None:
        """`--resume_from_checkpoint True` means the newest complete checkpoint (as docs/reliability.md says), not a
        folder named "True"; combined with `--overwrite_output_dir` (which discards checkpoints) it is refused."""
        resume = self.resume_from_checkpoint
        if isinstance(resume, str) and resume.strip().lower() in ("true", "false", ""):
            resume = self.resume_from_checkpoint = True if resume.strip().lower() == "true" else None
        if resume is not None and resume is not False and self.overwrite_output_dir and self.do_train:
            raise ValueError(
                "--resume_from_checkpoint and --overwrite_output_dir: the first continues a run, the second discards "
                "its checkpoints and starts afresh; pass only one"
            )

    @cached_property
    def _setup_devices(self) -> object:
        # transformers' CPU branch drops `ddp_timeout`: the gloo group would wait 30 minutes on a dead rank.
        # Created first with the timeout, accelerate then adopts it.
        if self.use_cpu and world_size() > 1:
            init_cpu_process_group(self.ddp_backend or "gloo", self.ddp_timeout)
        device = TrainingArguments._setup_devices.func(self)
        if world_size() > 1:
            set_default_group_timeout(self.ddp_timeout)  # the groups of pipelines and meshes too, on any backend
        start_heartbeat(self.ddp_timeout)  # so that a collective's timeout can name the rank that stopped
        return device

    def load_ipu_config(self, ipu_config: IPUConfig | None = None) -> IPUConfig:
        """The `IPUConfig` these arguments describe: `ipu_config_name` (or `ipu_config`), then the overrides,
        `n_ipu`, `auto_loss_scaling`, `gradient_checkpointing` and `seed` applied."""
        kwargs = {"n_ipu": self.n_ipu} if self.n_ipu else {}
        if ipu_config is None:
            name = self.ipu_config_name
            config = IPUConfig.from_pretrained(name, **kwargs) if name else IPUConfig(**kwargs)
        else:
            config = ipu_config.copy()
        if self.ipu_config_overrides:
            config.update_from_string(self.ipu_config_overrides)
        if not getattr(self, "accumulation_given", True):
            # not given: the config's value, so that these arguments say what training does
            self.gradient_accumulation_steps = config.gradient_accumulation_steps
        elif self.gradient_accumulation_steps != config.gradient_accumulation_steps:
            logger.warning(
                "--gradient_accumulation_steps %d overrides the IPU config's %d",
                self.gradient_accumulation_steps,
                config.gradient_accumulation_steps,
            )
            config.update_from_string(f"gradient_accumulation_steps={int(self.gradient_accumulation_steps)}")
        if self.n_ipu:
            config.update_from_string(f"replication_factor={replication_for_devices(config, self.n_ipu, '--n_ipu')}")
        if self.auto_loss_scaling:
            config.auto_loss_scaling = True
        # `activation_checkpointing` is transformers 5.2x's name for `gradient_checkpointing`.
        if getattr(self, "activation_checkpointing", None) or getattr(self, "gradient_checkpointing", None):
            config.recompute_checkpoint_every_layer = True
        # as Optimum Graphcore's trainer: --seed seeds the run and is written into the config it saves
        config.seed = self.seed
        return config

    def precision(self, device_type: str) -> str:
        """`"fp16"`, `"bf16"` or `"fp32"`: as asked, else bf16 on CUDA devices that support it, else fp32.

        Graphcore trained in half precision by default; on a CPU half precision is slower, so fp32 is used.
        """
        if self.fp16:
            return "fp16"
        if self.bf16:
            if device_type == "cpu" and not cpu_supports_bf16():
                # oneDNN emulates bf16 without AVX512-BF16 or AMX: a MiniLM QA training step took 22-27x its fp32
                # time on an AVX2 EPYC (benchmarks/cpu_bf16.py). Asked for, it is kept, but said once.
                logger.warning(
                    "--bf16: this CPU has no native bf16 (AVX512-BF16 or AMX), so it is emulated and much slower "
                    "than fp32; drop --bf16 to train in fp32"
                )
            return "bf16"
        if self.fp32 or device_type != "cuda":
            return "fp32"
        return "bf16" if supports_bf16() else "fp32"

    def output_dir_is_reusable(self) -> bool:
        """False when training would write into a non-empty `output_dir` without `overwrite_output_dir`."""
        directory = self.output_dir
        return self.overwrite_output_dir or not (os.path.isdir(directory) and os.listdir(directory))

    def checkpoint_in_output_dir(self) -> str | None:
        """The checkpoint a training script resumes from, checked before any work: `--resume_from_checkpoint`
        (a folder, or True: the newest complete one) must be complete and whole; else a non-empty `output_dir`
        is resumed from its newest complete checkpoint, or refused without `--overwrite_output_dir` (with it,
        `IPUTrainer.train` discards the earlier run's checkpoints before the first step). None when training
        starts afresh (or `do_train` is off)."""
        if not self.do_train:
            return None
        if self.resume_from_checkpoint is not None:
            return resolve_resume(self.resume_from_checkpoint, self.output_dir)
        if self.output_dir_is_reusable():
            return None
        checkpoint = last_complete_checkpoint(self.output_dir)
        if checkpoint is None:
            raise ValueError(
                f"Output directory ({self.output_dir}) already exists and is not empty. "
                "Use --overwrite_output_dir to overcome."
            )
        if self.resume_from_checkpoint is None:
            logger.info("Checkpoint detected, resuming training at %s", checkpoint)
        return checkpoint
