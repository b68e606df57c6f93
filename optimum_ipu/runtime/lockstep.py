"""Calls that every process of a `torchrun` job makes together, led by process 0.

A model whose stages run on separate processes answers a call only when every process of its replica runs it with the
same inputs (each forward goes through every stage). A server holds its socket in one process: `Lockstep` lets process
0 lead, sending each call's inputs to the others before it makes the call itself, while the others follow: they wait
for the next call, make it, and so on until process 0 says stop. A call's inputs travel as one small message (the
request); what the model computes travels as tensors, between stages.

A follower that receives nothing within the job's collective timeout raises (the leader died or stopped without
saying so); a follower ignores SIGTERM, which `torchrun` sends every process, so that a draining leader finishes the
calls in flight with it and then releases it.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_CALL, _STOP = "call", "stop"


def leads() -> bool:
    """Whether this process leads the job's calls (process 0, or the only one)."""
    return not dist.is_initialized() or dist.get_rank() == 0


class Lockstep:
    """Runs `fn` on every process of the job with the leader's arguments (see the module docstring).

    Args:
        fn (`Callable`): what every process calls; on the followers its result is dropped.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.stopped = False

    def lead(self, args: tuple, kwargs: dict[str, Any], local: dict[str, Any] | None = None) -> Any:
        """On the leader: send `args` and `kwargs` (and this process's random state, so that sampling draws alike
        wherever it happens) to every follower, then call `fn(*args, **kwargs, **local)` here; `local` (a streamer,
        say) stays in this process."""
        message = [(_CALL, args, kwargs, torch.get_rng_state())]
        dist.broadcast_object_list(message, src=0)
        return self.fn(*args, **kwargs, **(local or {}))

    def stop(self) -> None:
        """On the leader: release the followers (they return from `follow`). Once; nothing after it."""
        if not self.stopped:
            self.stopped = True
            dist.broadcast_object_list([(_STOP, (), {}, None)], src=0)

    def follow(self) -> None:
        """On a follower: make each call the leader sends, until it says stop. A call that raises is logged (the
        leader, given the same inputs, raises the same error and answers it)."""
        previous = signal.signal(signal.SIGTERM, _ignore_sigterm)
        try:
            while True:
                message: list[Any] = [None]
                dist.broadcast_object_list(message, src=0)
                kind, args, kwargs, random_state = message[0]
                if kind == _STOP:
                    return
                torch.set_rng_state(random_state)
                try:
                    self.fn(*args, **kwargs)
                except Exception as error:  # the leader answers it; the stages must stay in step for the next call
                    logger.info("a call failed here as on the leading process: %s", error)
        finally:
            signal.signal(signal.SIGTERM, previous)


def _ignore_sigterm(signum: int, frame: Any) -> None:
    logger.info("SIGTERM: this process follows process 0, which drains the server and then releases it")
