"""Generation calls in lanes (`Lockstep.lead(..., overlap=True)`) on a model whose stages run on separate processes,
for tests/distributed/test_generation_lanes.py.

    torchrun --nproc_per_node 2 lanes_worker.py OUT_DIR MODEL_DIR

Each process loads its stage. Process 0 leads: a long greedy call over four prompts (two groups, one per stage) in a
lane, its streamer slowing each step; once it has decoded two steps, a short call of one prompt in the other lane
(it joins the rotation of turns while the long one decodes); then a call alone (it waits for both lanes). The other
process follows. Every rank writes OUT_DIR/rank{r}.json: each call's tokens as this process got them and, on
process 0, how many steps the long call had decoded when the short one returned.
"""

from __future__ import annotations

import sys
import threading
import time

import torch
import torch.distributed as dist
import transformers

import optimum_ipu
from optimum_ipu import IPUConfig
from optimum_ipu.runtime.lockstep import Lockstep
from tests.distributed.pipeline_worker import write_rank_record

PAD = 0
LONG_TOKENS, SHORT_TOKENS, STEP_PAUSE_S = 24, 4, 0.02


def call_prompts(vocab: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Four left-padded prompts for the long call, one for the short call and the call alone."""
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(3, vocab - 1, (5, 6), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = PAD, 0
    return {"long": (ids[:4], mask[:4]), "short": (ids[4:], mask[4:]), "alone": (ids[4:], mask[4:])}


CALLS = {"long": LONG_TOKENS, "short": SHORT_TOKENS, "alone": SHORT_TOKENS}


class SlowSteps(transformers.generation.streamers.BaseStreamer):
    """Counts the long call's steps, pausing at each (outside the stages' turns) so that it decodes for a while."""

    def __init__(self) -> None:
        self.steps = 0
        self.second_step = threading.Event()

    def put(self, value: torch.Tensor) -> None:
        if value.dim() == 2 and value.shape[1] > 1:  # the prompts
            return
        self.steps += 1
        if self.steps == 2:
            self.second_step.set()
        time.sleep(STEP_PAUSE_S)

    def end(self) -> None:
        pass


def main() -> None:
    out, model_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    model = optimum_ipu.AutoModelForCausalLM.from_pretrained(model_dir, ipu_config=IPUConfig(layers_per_ipu=[2, 2]))
    prompts = call_prompts(model.config.vocab_size)
    record: dict = {"tokens": {}}

    def call(name: str, streamer: SlowSteps | None = None) -> torch.Tensor:
        ids, mask = prompts[name]
        output = model.generate(input_ids=ids, attention_mask=mask, pad_token_id=PAD, do_sample=False,
                                max_new_tokens=CALLS[name], streamer=streamer)  # fmt: skip
        record["tokens"][name] = output.tolist()
        return output

    lockstep = Lockstep(call, lanes=2)
    if dist.get_rank() != 0:
        lockstep.follow()
    else:
        slow = SlowSteps()
        long_call = threading.Thread(target=lambda: lockstep.lead(("long",), {}, {"streamer": slow}, overlap=True))
        long_call.start()
        assert slow.second_step.wait(timeout=120), "the long call did not decode"
        lockstep.lead(("short",), {}, overlap=True)
        record["long_steps_when_short_returned"] = slow.steps
        long_call.join()
        lockstep.lead(("alone",), {})
        lockstep.stop()
    generation = model._stage_generation
    record["lane_links"] = [len(links) for links in generation._lanes]
    record["rotation_left"] = generation._lane_turns._active
    write_rank_record(out, record)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
