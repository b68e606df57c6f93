"""A `pipeline()` served by every process of a `torchrun` job whose model stages run on separate processes.

`lockstep(pipe)` returns, on process 0, the pipeline as a caller sees it, each call first sent to the other processes
(`optimum_ipu.runtime.lockstep.Lockstep`); on the other processes it runs those calls until process 0 closes it, and
then returns `None`. In one process it returns `pipe` itself. `optimum-ipu serve` under `torchrun` holds its socket in
process 0 this way; the stages answer every request together, and a request whose client has gone ends its rows on
every process at the same step through `LeaderStop` (a stopping criterion only process 0 decides).

Generation calls made with `LeadingPipeline.call_overlapping` decode beside each other, in lanes, where the model's
stages allow it (`LeadingPipeline.overlaps`): a server's batch that arrives while another decodes starts at once.
"""

from __future__ import annotations

import functools
from typing import Any

from ..models.generation import stage_generation
from ..models.pipelined import PipelinedModel
from ..runtime.distributed import is_collective_error, join_process_group, silent_ranks, start_heartbeat, world_size
from ..runtime.joined_rows import RowsControl, RowsSchedule, decode_joined, rows_can_join
from ..runtime.lockstep import LANES, LeaderStop, Lockstep, leads
from ..runtime.stages.generation import decodes_in_lanes
from ..runtime.tensor_parallel import is_tensor_parallel

# what a caller hands the pipeline that stays in its own process: the generation streamer feeds its requests
LOCAL_ARGUMENTS = ("streamer",)
JOINED_ROWS = "joined-rows"  # the call of continuous batching across the processes (`decode_joined_rows`)


def causal_model(pipe: Any) -> Any:
    """The `transformers` model of a text-generation pipeline (inside its `PipelinedModel`, where it has one)."""
    model = pipe.model
    return model.model if isinstance(model, PipelinedModel) else model


def decode_joined_rows(pipe: Any, seed: int, schedule: RowsSchedule | None = None) -> None:
    """Continuous batching's decoding on this process's model, with every process of the job; `schedule` on process 0
    only. Through stages on the processes, one group of rows per stage in flight (`StageGeneration.decode_joined`);
    else one group, each process running every layer or its share of each (`runtime.joined_rows.decode_joined`)."""
    pipelined = getattr(pipe, "pipelined", None)
    generation = stage_generation(pipelined) if pipelined is not None else None
    if generation is not None:
        generation.decode_joined(seed, schedule)
    else:
        decode_joined(causal_model(pipe), seed, schedule)


def why_rows_cannot_join(pipe: Any) -> str | None:
    """Why rows cannot join a running batch of `pipe`'s model (`runtime.joined_rows`), or None: the model whole in
    one process, split over the job's processes by tensor parallelism, or a decoder-only model whose stages are the
    job's processes (one replica, not sharded); and its KV cache keeping every position (no sliding window)."""
    model = causal_model(pipe)
    pipelined = getattr(pipe, "pipelined", None)
    staged = pipelined is not None and decodes_in_lanes(pipelined.model)
    if hasattr(pipe, "lockstep") and not is_tensor_parallel(model) and not staged:
        return (
            "rows join a running batch through stages that are every process of the job (one replica, not "
            "sharded) of a decoder-only model, or where each process holds a share of every layer "
            "(tensor_parallel_size in the IPU config): change the layout or leave it out"
        )
    if not rows_can_join(model.config):
        return (
            f"{type(model).__name__}'s KV cache keeps a sliding window, beside which rows of other lengths cannot be "
            "put: leave it out, or in one process use --continuous-batching-engine transformers"
        )
    return None


def _targets(pipe: Any) -> dict[str, Any]:
    return {JOINED_ROWS: functools.partial(decode_joined_rows, pipe)}


class LeadingPipeline:
    """Process 0's pipeline under `torchrun`: calls go to every process first; anything else is the pipeline's.

    Args:
        pipe: the pipeline of this process (its model holds this process's stage).
        lanes (`int`, *optional*, defaults to `LANES`): generation calls that may decode at once
            (`call_overlapping`).
    """

    def __init__(self, pipe: Any, lanes: int = LANES) -> None:
        self.pipe = pipe
        self.lockstep = Lockstep(pipe, lanes, _targets(pipe))
        self.lost: str | None = None  # why the processes are no longer in step (a collective that failed)

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return self._lead((inputs, *args), kwargs, overlap=False)

    def call_overlapping(self, inputs: Any, **kwargs: Any) -> Any:
        """A call of the pipeline that decodes beside other such calls where `overlaps` (else alone, as a call):
        text generation without a seed (the calls' sampling draws from each process's own generator)."""
        return self._lead((inputs,), kwargs, overlap=self.overlaps)

    @functools.cached_property
    def overlaps(self) -> bool:
        """Whether `call_overlapping` calls decode beside each other: a text-generation pipeline whose decoder-only
        model's stages are the job's processes, with more than one lane."""
        pipelined = getattr(self.pipe, "pipelined", None)
        return (
            self.lockstep.lanes.count > 1
            and getattr(self.pipe, "task", None) == "text-generation"
            and pipelined is not None
            and decodes_in_lanes(pipelined.model)
        )

    def decode_joined_rows(self, seed: int, schedule: RowsSchedule) -> None:
        """Continuous batching's decoding on every process (`decode_joined_rows`), led by `schedule`, alone."""
        self._lead((), {"seed": seed}, overlap=False, local={"schedule": schedule}, target=JOINED_ROWS)

    def _lead(
        self,
        args: tuple,
        kwargs: dict[str, Any],
        overlap: bool,
        local: dict[str, Any] | None = None,
        target: str | None = None,
    ) -> Any:
        local = {**(local or {}), **{k: kwargs.pop(k) for k in LOCAL_ARGUMENTS if k in kwargs}}
        if self.lost is not None:
            raise RuntimeError(f"a stage process is lost: {self.lost}")
        try:
            return self.lockstep.lead(args, kwargs, local, overlap=overlap, target=target)
        except RuntimeError as err:  # torch.distributed's: a peer gone, or silent past the group's timeout
            if is_collective_error(err):
                self.lost = " ".join(str(err).split())[:300]
            raise

    def check_stages(self) -> str | None:
        """Why the processes are no longer in step, or None: a collective that failed, or processes whose heartbeat
        (`join_stage_processes`) went silent, a stage stopped while no call needs it."""
        if self.lost is None:
            silent = silent_ranks()
            if silent:
                self.lost = f"process(es) {silent} of the job stopped answering (their heartbeat is silent)"
        return self.lost

    def close(self) -> None:
        """Release the other processes (they return from `lockstep`); every call after it fails."""
        self.lockstep.stop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipe, name)


def join_stage_processes(timeout_s: float) -> None:
    """Under `torchrun`, join the job's process group with `timeout_s` for every collective (what a call waits for a
    stopped or hung stage process), and start this process's heartbeat (`LeadingPipeline.check_stages` reads the
    others'); nothing in one process. Before `pipeline()` loads a stage."""
    seconds = max(1, round(timeout_s))
    join_process_group(timeout_s=seconds)
    start_heartbeat(seconds)


def lockstep(pipe: Any, lanes: int = LANES) -> Any:
    """The pipeline a server calls: `pipe` in one process; under `torchrun`, on process 0 a `LeadingPipeline` (with
    `lanes` generation calls at once at most), and on the others `None` once process 0 has closed it (meanwhile they
    make its calls)."""
    if world_size() == 1:
        return pipe
    if leads():
        return LeadingPipeline(pipe, lanes)
    Lockstep(pipe, targets=_targets(pipe)).follow()
    return None


def release(pipe: Any) -> None:
    """Release the other processes of a `torchrun` job from `lockstep` (nothing for a pipeline of one process)."""
    if isinstance(pipe, LeadingPipeline):
        pipe.close()


__all__ = [
    "LOCAL_ARGUMENTS",
    "LeaderStop",  # (the server's stopping criterion of gone requests' rows, `runtime.lockstep`'s, handed on here)
    "LeadingPipeline",
    "RowsControl",  # (continuous batching's decision and its schedule, `runtime.joined_rows`'s, handed on here)
    "RowsSchedule",
    "causal_model",
    "decode_joined_rows",
    "why_rows_cannot_join",
    "join_stage_processes",
    "lockstep",
    "release",
]
