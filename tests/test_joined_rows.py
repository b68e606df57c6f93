"""Continuous batching's decoding (`runtime/joined_rows.py`): rows that join a running batch and leave it get the
tokens each prompt gets from `generate()` alone, for every registered causal language model; sampled rows draw alike
from the same seed (what keeps processes of a split model in step); a model whose cache rows cannot join is refused
with one line."""

from __future__ import annotations

import pytest
import torch

from optimum_ipu.models.pipelined_classes import transformers_class
from optimum_ipu.models.plans import plan_for_class, registered_classes
from optimum_ipu.runtime.joined_rows import JoinedRows, RowsControl, RowsSchedule, decode_joined

from .tiny_models import tiny_config

CAUSAL = sorted(name for name in registered_classes() if name.endswith(("ForCausalLM", "LMHeadModel")))
PROMPTS = [[5, 6, 7], [9, 3, 9, 3, 9, 3, 9, 3, 9, 3, 9], [1, 2], [30, 31, 32, 33, 34, 35]]
GREEDY = (0.0, 1.0)
NEW = 10


def causal_model(class_name: str) -> torch.nn.Module:
    """A tiny random model whose greedy tokens vary (large initial weights: no token repeats forever), attending to
    every position (no sliding window: `test_a_cache_rows_cannot_join_is_refused`)."""
    torch.manual_seed(0)
    config = tiny_config(plan_for_class(class_name).family)
    config.initializer_range = 0.5
    if getattr(config, "sliding_window", None) is not None:
        config.sliding_window = None
    return transformers_class(class_name)(config).eval()


def alone(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


class Script(RowsSchedule):
    """A schedule that lets prompts join at given steps and ends rows at `NEW` tokens, or `early` ones sooner."""

    def __init__(self, joins: dict[int, list[int]], early: dict[int, int], sampling: tuple[float, float] = GREEDY):
        self.joins, self.early, self.sampling = joins, early, sampling
        self.step, self.running, self.got = 0, [], {}

    def control(self, rows: int, group: int = 0) -> RowsControl:
        assert rows == len(self.running)
        limit = lambda p: self.early.get(p, NEW)  # noqa: E731
        ends = [i for i, p in enumerate(self.running) if len(self.got[p]) >= limit(p)]
        self.running = [p for p in self.running if len(self.got[p]) < limit(p)]
        joining = self.joins.pop(self.step, [])
        self.step += 1
        self.running += joining
        self.got.update({p: [] for p in joining})
        finished = not self.running and not self.joins
        return RowsControl(ends, [PROMPTS[p] for p in joining], [self.sampling] * len(joining), finished)

    def tokens(self, joined: list[int] | None, stepped: list[int] | None, group: int = 0) -> None:
        rows = self.running[len(self.running) - len(joined) :] if joined is not None else self.running
        for p, token in zip(rows, joined if joined is not None else stepped, strict=True):
            self.got[p].append(token)


@pytest.mark.parametrize("class_name", CAUSAL)
def test_rows_joining_and_leaving_get_the_tokens_of_generate_alone(class_name):
    model = causal_model(class_name)
    want = [alone(model, prompt) for prompt in PROMPTS]
    assert len({tuple(w) for w in want}) == len(want), "identical continuations would prove little"
    # 0 and 1 start; 2 and 3 join while they decode (3 before 0 ends, 2 after 1 left early: a row taken out and
    # another put in, the columns of the longest prompt dropped once it is gone)
    script = Script(joins={0: [0, 1], 3: [3], 7: [2]}, early={1: 4})
    decode_joined(model, seed=0, schedule=script)
    assert script.got == {0: want[0], 1: want[1][:4], 2: want[2], 3: want[3]}


def test_sampled_rows_draw_alike_from_one_seed():
    """Two processes of a split model run the same rows with the same seed: the same draws (and not the greedy
    tokens)."""
    model = causal_model(CAUSAL[0])
    runs = []
    for _ in range(2):
        script = Script(joins={0: [0, 1], 2: [3]}, early={}, sampling=(1.5, 0.9))
        decode_joined(model, seed=7, schedule=script)
        runs.append(script.got)
    assert runs[0] == runs[1]
    assert runs[0][0] != alone(model, PROMPTS[0])


def test_a_cache_rows_cannot_join_is_refused():
    """A sliding-window cache keeps only its window: rows of other lengths cannot be put beside it."""
    class_name = next(name for name in CAUSAL if name.startswith("Mistral"))
    torch.manual_seed(0)
    config = tiny_config(plan_for_class(class_name).family)
    config.sliding_window = 4
    model = transformers_class(class_name)(config).eval()
    with pytest.raises(ValueError, match="cannot join; serve it without --continuous-batching"):
        JoinedRows(model, seed=0).join([PROMPTS[0]], [GREEDY])
