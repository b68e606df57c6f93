"""The device-topology rules, one message each: how an `IPUConfig`'s device slots map onto processes and devices.

Pure Python (no torch), at the config layer, so the CLI, the training arguments, the runtime and the trainer all
call the same rule and say the same thing:

- a replica holds `ipus_per_replica` pipeline stages of `tensor_parallel_size` devices each (`tensor_parallel_size`;
  the mesh axes `dp` x `pp` x `tp`, `tp` innermost);
- a pod of `n_ipu` devices holds `n_ipu / (ipus_per_replica x tensor_parallel_size)` replicas
  (`replication_for_devices`);
- under `torchrun`, each process holds one device slot: processes =
  `ipus_per_replica x replication_factor x tensor_parallel_size` (`check_processes`; one process runs every slot in
  turn);
- stages on separate processes need at least one micro-batch each (`check_micro_batches`);
- the pipeline schedule is one of `SCHEDULE_NAMES` (`check_schedule`);
- how many replicas one process runs in turn, in training and in inference (`replicas_per_process`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import IncompatibleIPUConfigError, short_repr

if TYPE_CHECKING:
    from .config import IPUConfig

SCHEDULE_NAMES = ("1F1B", "GPipe", "Interleaved1F1B", "ZeroBubble")
# schedules that run several stages per process (torch.distributed.pipelining's interleaved ones)
MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "ZeroBubble")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_schedule(name: str, flag: str = "--pipeline_schedule") -> None:
    """A pipeline schedule name: `"1F1B"`, `"GPipe"`, `"Interleaved1F1B"` or `"ZeroBubble"`."""
    if name not in SCHEDULE_NAMES:
        raise IncompatibleIPUConfigError(f"{flag}: got {short_repr(name)}; expected one of {', '.join(SCHEDULE_NAMES)}")


def tensor_parallel_size(config: IPUConfig, inference: bool = False) -> int:
    """Devices that share each pipeline stage of a replica (the mesh's innermost axis `tp`): the training
    `tensor_parallel_size`, or `inference_tensor_parallel_size` with `inference`, whatever the config's mode."""
    return config.value("tensor_parallel_size", inference=inference)


def replication_for_devices(config: IPUConfig, n_ipu: int, flag: str = "n_ipu") -> int:
    """The training `replication_factor` that fills a pod of `n_ipu` devices:
    `n_ipu / (ipus_per_replica x tensor_parallel_size)` (Graphcore's `n_ipu`: `--n_ipu` of the scripts, `--n-ipu` of
    `optimum-ipu config check`)."""
    if not _is_count(n_ipu):
        name = flag if flag.startswith("--") else f"`{flag}`"
        raise IncompatibleIPUConfigError(f"{name}: got {short_repr(n_ipu)}; expected the number of devices, >= 1")
    ipus, tp = config.value("ipus_per_replica"), tensor_parallel_size(config)
    if n_ipu % (ipus * tp):
        per_replica, smaller = f"`ipus_per_replica` {ipus}", ""
        if tp > 1:
            per_replica += f" x `tensor_parallel_size` {tp}"
            smaller = " or a smaller `tensor_parallel_size`"
        raise IncompatibleIPUConfigError(
            f"{flag} {n_ipu} is not a multiple of {per_replica} (one replica needs {ipus * tp} device slots); "
            f"use a multiple of {ipus * tp}, or fewer stages in `layers_per_ipu`{smaller}"
        )
    return n_ipu // (ipus * tp)


def check_micro_batches(micro_batches: int, stages: int) -> None:
    """Stages on separate processes need at least one micro-batch each for the pipeline schedule."""
    if stages > 1 and micro_batches < stages:
        raise IncompatibleIPUConfigError(
            f"`gradient_accumulation_steps` {micro_batches} is below the {stages} pipeline stages on separate "
            f"processes (the schedule needs at least one micro-batch per stage); set it to {stages} or more"
        )


def stages_per_process(config: IPUConfig, processes: int, schedule: str, flag: str = "--pipeline_schedule") -> int:
    """Pipeline stages each of `processes` processes holds: 1, or with an interleaved schedule (`Interleaved1F1B`,
    `ZeroBubble`) `ipus_per_replica / (processes / replication_factor / tensor_parallel_size)` when the stages divide
    evenly over them."""
    per = _stages_each(config, processes)
    if per > 1 and schedule not in MULTI_STAGE_SCHEDULES:
        ipus, replicas, tp = (
            config.value("ipus_per_replica"),
            config.value("replication_factor"),
            tensor_parallel_size(config),
        )
        ranks = processes // (replicas * tp)
        where = "a replica" if tp == 1 else f"a replica's pipeline (x {tp} tensor-parallel)"
        raise IncompatibleIPUConfigError(
            f"{flag} {schedule} runs one pipeline stage per process, but {ipus} stages over {ranks} processes "
            f"{where} are {per} each; use {flag} {' or '.join(MULTI_STAGE_SCHEDULES)}, or launch "
            f"torchrun --nproc_per_node {ipus * replicas * tp}"
        )
    return per


def _stages_each(config: IPUConfig, processes: int) -> int:
    """Stages per process when `processes` (more than one) divide a replica's stages evenly into 2 or more each; else 1
    (`check_processes` then says what fits). The ranks of a replica's pipeline are `processes / replicas / tp`."""
    ipus, replicas, tp = (
        config.value("ipus_per_replica"),
        config.value("replication_factor"),
        tensor_parallel_size(config),
    )
    if processes <= 1 or processes == ipus * replicas * tp or processes % (replicas * tp):
        return 1
    ranks = processes // (replicas * tp)
    return ipus // ranks if ranks >= 2 and ipus % ranks == 0 else 1


def check_processes(config: IPUConfig, processes: int, stages_per_process: int = 1, micro_batches: bool = True) -> None:
    """The training layout of `config` runs as a job of `processes` processes: one runs every device slot in turn;
    several hold `stages_per_process` slots each (1 unless an interleaved schedule runs,
    `stages_per_process()`), `ipus_per_replica x replication_factor x tensor_parallel_size / stages_per_process` of
    them, with a micro-batch per process of a pipeline (not checked with `micro_batches=False`: a job that only
    evaluates or generates runs no training schedule)."""
    if not _is_count(processes):
        raise IncompatibleIPUConfigError(f"`processes`: got {short_repr(processes)}; expected an integer >= 1")
    if processes == 1:
        return
    ipus, replicas, tp = (
        config.value("ipus_per_replica"),
        config.value("replication_factor"),
        tensor_parallel_size(config),
    )
    slots = ipus * replicas * tp
    if stages_per_process > 1 and slots == processes * stages_per_process:
        if micro_batches:
            check_micro_batches(config.value("gradient_accumulation_steps"), ipus // stages_per_process)
        return
    if slots != processes:
        if processes % (ipus * tp) == 0:
            fix = f"set `replication_factor` to {processes // (ipus * tp)} (--n_ipu {processes})"
        elif tp > 1 and processes % (ipus * replicas) == 0:
            fix = f"set `tensor_parallel_size` to {processes // (ipus * replicas)}"
        else:
            fix = "run one process"
        made = f"`ipus_per_replica` ({ipus}) x `replication_factor` ({replicas})"
        if tp > 1:
            made += f" x `tensor_parallel_size` ({tp})"
        raise IncompatibleIPUConfigError(
            f"{processes} processes, but {made} make {slots} device slots, one a process; launch "
            f"torchrun --nproc_per_node {slots}, or {fix}"
        )
    if micro_batches:
        check_micro_batches(config.value("gradient_accumulation_steps"), ipus)


def replicas_per_process(config: IPUConfig, processes: int, inference: bool = False) -> int:
    """How many data-parallel replicas one process runs, one after the other (their micro-batches accumulate).

    Training: all of them in one process; under `torchrun` one (`check_processes` says why a job does not fit).
    Inference: the inference replicas shared out over the groups of `inference_tensor_parallel_size` processes
    (those of a group share one replica's matrices), at least one each.
    """
    replicas = config.value("replication_factor", inference=inference)
    if inference:
        return max(1, replicas // max(1, processes // tensor_parallel_size(config, inference=True)))
    if processes == 1:
        return replicas
    check_processes(config, processes, _stages_each(config, processes))  # the schedule is checked by the engine
    return 1
