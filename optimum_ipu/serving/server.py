"""`serve(settings)`: build the pipeline, then answer HTTP with uvicorn until SIGTERM (or Ctrl+C) drains it.

Graceful shutdown: the first SIGTERM / SIGINT starts draining: `/health` says 503 (a load balancer stops sending),
new requests get 503, the requests in flight finish; once none is left (or after `request_timeout`), uvicorn
closes and the process exits with code 0. A second signal stops at once (uvicorn's own handling).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from types import FrameType
from typing import Any

import torch
import uvicorn

from .app import ServerState, create_app
from .settings import SPEECH_TASK, ServeSettings

logger = logging.getLogger(__name__)


def load_pipeline(settings: ServeSettings) -> Any:
    """The `pipeline()` the server hands requests to: the task (given, else inferred as `pipeline()` infers it) on
    the model, in the IPU config's inference layout, with `settings.generate_kwargs` as every call's defaults."""
    from ..pipelines import pipeline
    from ..pipelines.defaults import infer_task
    from ..pipelines.factory import SUPPORTED_TASKS

    task, defaults = settings.task, {}
    if settings.generate_kwargs:
        task = task or infer_task(settings.model, SUPPORTED_TASKS)
        if task != SPEECH_TASK:  # OpenAI's transcriptions carry no generate() arguments; the other tasks' requests do
            raise ValueError(
                f"--generate-kwargs: the {task} task takes its generation arguments per request (the completions' "
                "fields, or the body of /v1/pipeline/<task>); --generate-kwargs is for automatic-speech-recognition"
            )
        defaults["generate_kwargs"] = settings.generate_kwargs
    return pipeline(task, model=settings.model, ipu_config=settings.ipu_config, backend=settings.backend, **defaults)


def serve(settings: ServeSettings, log_level: str = "info") -> int:
    """Serve `settings.model` over HTTP until a signal drains the server; returns the exit code (0; 1 under
    `torchrun` when a stage process had died).

    Under `torchrun`, with the IPU config's stages on separate processes, each process loads its stage; process 0
    holds the socket and every request runs on all of them together (`optimum_ipu.pipelines.processes.lockstep`);
    the other processes return once process 0 has drained and released them. A stage process that dies ends the job:
    `torchrun` stops the others (SIGTERM: process 0 drains, `/health` says 503, then it exits with code 1). A stage
    process that stops answering without dying (stopped, hung) fails the first call that needs it after
    `settings.stage_timeout` seconds: that request gets a 500, `/health` says 503, and process 0 drains and exits with
    code 1 (`torchrun` then stops the others).

    Args:
        settings (`ServeSettings`): the model, its task and IPU config, the address and the limits.
        log_level (`str`, *optional*, defaults to `"info"`): uvicorn's log level.

    Example:

    ```python
    >>> from optimum_ipu.serving import ServeSettings, serve
    >>> serve(ServeSettings("path/to/model", port=8000))  # until Ctrl+C or SIGTERM
    ```
    """
    from ..pipelines.processes import join_stage_processes, lockstep

    join_stage_processes(settings.stage_timeout)  # (under torchrun: every collective waits stage_timeout at most)
    pipe = lockstep(load_pipeline(settings), settings.batches_in_flight)
    if pipe is None:  # another process of the job: it made process 0's calls until released
        return 0
    note = layout_note(pipe)
    if note:
        logger.warning(note)
    leave_cores_to_onnx_runtime(pipe)
    app = create_app(pipe, settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        timeout_graceful_shutdown=int(settings.request_timeout) + 1,
    )
    try:
        DrainingServer(config, app.state.server).run()
    finally:
        lost = getattr(pipe, "lost", None)
        if lost is not None:
            logger.error(
                "a stage process stopped answering (%s): the other stage processes could not be released, exiting "
                "with code 1",
                lost,
            )
        released = lost is None and _release(pipe)
    return 0 if released else 1


def leave_cores_to_onnx_runtime(pipe: Any) -> None:
    """One thread for torch in a server whose model ONNX Runtime runs, unless `OMP_NUM_THREADS` says otherwise.

    ONNX Runtime's intra-op threads then take every core; torch does only the requests' pre- and post-processing,
    whose OpenMP threads, spinning after each of its small operations, took cores from them: measured on the 2-core
    CPU, the MiniLM's question-answering call took 6.1 ms (p50) inside the server against 5.3 ms in a script, and
    5.8 ms with torch on one thread (the script's own call: 5.3 ms either way). The server is a process of its own:
    no caller's torch work shares it."""
    runner = getattr(pipe, "runner", None)
    if getattr(runner, "backend", None) != "onnxruntime" or "OMP_NUM_THREADS" in os.environ:
        return
    if torch.get_num_threads() > 1:
        logger.info("ONNX Runtime runs the model on every core: torch takes one thread for the requests' processing")
        torch.set_num_threads(1)


def _release(pipe: Any) -> bool:
    """Release the other processes of the job; False (said in one line) when one of them has gone: a stage process
    that died ends the job, whose launcher (`torchrun`) stops this process too, with a non-zero code."""
    from ..pipelines.processes import release

    try:
        release(pipe)
    except RuntimeError as err:  # (torch.distributed's errors: a peer that closed its connection, a timeout)
        logger.error("the other stage processes could not be released (%s): exiting with code 1", _one_line(err))
        return False
    return True


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose first SIGTERM / SIGINT drains (see the module docstring) instead of closing the
    connections of requests still computing."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.drain_started: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started is None:
            # (not recorded as uvicorn records a signal: it would raise it again at the end, and the process would
            # end by the signal rather than with code 0)
            self.drain_started = time.monotonic()
            logger.info("%s: draining before shutdown", signal.Signals(sig).name)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        checked = counter % 10 == 0  # (uvicorn ticks every 0.1 s: the stages' heartbeats are read once a second)
        if self.drain_started is None and checked and self.state.stage_loss() is not None:
            self.drain_started = time.monotonic()  # a stage process is lost: drain what is in flight, then exit 1
            logger.error("a stage process is lost: draining before shutdown")
        if self.drain_started is not None and not self.should_exit:
            self.state.begin_draining()
            overdue = time.monotonic() - self.drain_started > self.state.settings.request_timeout + 1
            if self.state.idle or overdue:
                self.should_exit = True
        return await super().on_tick(counter)


def layout_note(pipe: Any) -> str | None:
    """What to say once at start when the pipeline's inference layout has several stages or replicas: this
    server runs them all in its one process (None for one stage and one replica)."""
    stages = pipe.ipu_config.value("ipus_per_replica", inference=True)
    replicas = pipe.ipu_config.value("replication_factor", inference=True)
    if stages == 1 and replicas == 1 or hasattr(pipe, "lockstep"):  # one stage, or the stages on processes
        return None
    return (
        f"serve: the IPU config's inference layout has {stages} stage(s) x {replicas} replica(s); this server runs "
        "them all in this one process, in turn (under torchrun --nproc_per_node <stages> each stage runs in a process "
        "of its own)"
    )
