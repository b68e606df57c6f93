"""`IPUTrainerState`: Optimum Graphcore's name for the state `IPUTrainer` keeps (`trainer.state`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from transformers import TrainerState

# Fields of `IPUTrainerState` that `transformers.TrainerState` does not have.
IPU_ONLY_FIELDS = ("start_time",)


@dataclass
class IPUTrainerState(TrainerState):
    """`transformers.TrainerState` with Optimum Graphcore's one addition, `start_time`.

    `IPUTrainer.state` is an `IPUTrainerState`: every field of `TrainerState` (`global_step`, `epoch`, `max_steps`,
    `log_history`, `best_metric`, ...) means what it means there, and `TrainerCallback`s receive this object.

    Optimum Graphcore's `IPUTrainerState` (`optimum.graphcore.trainer`) added `start_time`, the wall-clock time
    (`time.time()`) at which training started, and wrote it into `trainer_state.json`; its resume read it back so
    that `train_runtime` counted from the first start. Here `start_time` is the time the current `train()` call
    started (a resumed run's own start): `train_runtime` and the `*_per_second` metrics are those of
    `transformers.Trainer`, which measure the current call only. It is not written into `trainer_state.json`,
    because `transformers.Trainer` reads that file with `TrainerState`, which refuses a key it does not know, and
    `IPUTrainer`'s checkpoints resume under a plain `Trainer` too. `IPUTrainerState.load_from_json` reads
    Optimum Graphcore's files (with `start_time`) and stock ones (without: `start_time` is -1).

    Args:
        start_time (`float`, *optional*, defaults to -1.0): `time.time()` when the current `train()` call started;
            -1 before training.
    """

    start_time: float = -1.0

    @classmethod
    def from_state(cls, state: TrainerState, start_time: float | None = None) -> IPUTrainerState:
        """The same state as an `IPUTrainerState` (the same `log_history` list and callback states, not copies).

        Args:
            state (`transformers.TrainerState`): the state to take over.
            start_time (`float`, *optional*): the training start; defaults to `state.start_time` if it has one,
                else -1.
        """
        values = {f.name: getattr(state, f.name) for f in dataclasses.fields(TrainerState)}
        if start_time is None:
            start_time = getattr(state, "start_time", -1.0)
        return cls(**values, start_time=start_time)

    def save_to_json(self, json_path: str) -> None:
        """Write the fields of `transformers.TrainerState` to `json_path`, as `TrainerState.save_to_json` does (so
        that `TrainerState.load_from_json` reads the file); `start_time` is left out."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k not in IPU_ONLY_FIELDS}
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(values, indent=2, sort_keys=True) + "\n")
