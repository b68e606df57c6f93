"""Generation calls in lanes on 2 stages under torchrun (gloo): a short call made while a long one decodes joins the
stages' rotation of turns and returns before the long one ends; every call's greedy tokens are those of the stock
model in one process, on both processes; a call alone after them waits for the lanes and runs as before."""

from __future__ import annotations

import json

import torch
import transformers

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from ..tiny_models import VOCAB, tiny_config
from .lanes_worker import CALLS, LONG_TOKENS, PAD, call_prompts

WORKER = str(REPO_ROOT / "tests" / "distributed" / "lanes_worker.py")


def test_a_call_joins_the_stages_while_another_decodes(tmp_path):
    config = tiny_config("llama")
    config.initializer_range = 0.5  # tokens that vary from step to step
    config.pad_token_id, config.bos_token_id, config.eos_token_id = PAD, VOCAB - 1, VOCAB - 1
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "llama")
    out = tmp_path / "out"
    run = launch(
        *TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", WORKER, str(out), str(tmp_path / "llama")
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    want = {}
    with torch.no_grad():
        for name, (ids, mask) in call_prompts(VOCAB).items():
            want[name] = model.generate(
                input_ids=ids, attention_mask=mask, pad_token_id=PAD, do_sample=False, max_new_tokens=CALLS[name]
            ).tolist()
    assert len({tuple(row) for row in want["long"]}) == 4, "identical rows would prove little"
    for rank, record in enumerate(ranks):
        assert record["tokens"] == want, rank
        assert record["lane_links"] == [2, 2], rank  # each lane's process groups, one per stage
        assert record["rotation_left"] == [], rank  # every group left the rotation
    # the short call decoded beside the long one: it returned while the long one still had steps to go
    assert ranks[0]["long_steps_when_short_returned"] < LONG_TOKENS - 4, ranks[0]
