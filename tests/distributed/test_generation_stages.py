"""Serving across stages: `generate()` (greedy, beam search, sampling with a seed) and `pipeline("text-generation")` of
a model whose stages run on separate processes, each loaded stage-local under torchrun, give the tokens of the stock
model in one process; each process's KV cache holds keys and values for its own layers only."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from ..tiny_models import VOCAB, tiny_config
from .generation_worker import (
    CASES,
    GROUPED,
    JOINED_EARLY,
    JOINED_NEW,
    JOINED_PROMPTS,
    PAD,
    PIPELINE_CALL,
    PROMPTS,
    SEED,
    STOP_AFTER,
    STOPPED_ROW,
    four_prompts,
    prompts,
)

WORKER = str(REPO_ROOT / "tests" / "distributed" / "generation_worker.py")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny Llama whose tokens vary from step to step (the default init repeats one token)."""
    config = tiny_config("llama")
    config.initializer_range = 0.5
    config.pad_token_id, config.bos_token_id, config.eos_token_id = PAD, VOCAB - 1, VOCAB - 1
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("llama-generating")
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2_dir(tiny_pretrained):
    """A tiny GPT-2 with its tokenizer (the worker runs the text-generation pipeline too)."""
    return tiny_pretrained("GPT2LMHeadModel", initializer_range=0.5)


def run_stages(out, model_dir, layout: list[int], *flags: str) -> list[dict]:
    """The worker on one process per stage (2 replicas of them with `--fsdp`); every rank's record."""
    processes = len(layout) * (2 if "--fsdp" in flags else 1)
    args = [str(out), str(model_dir), json.dumps(layout), *flags]
    run = launch(*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}", WORKER, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(processes)]


def one_process_tokens(model: transformers.PreTrainedModel, stages: int) -> dict[str, list]:
    """Each case of the worker, by the stock model's `generate()` in this process. The worker seeds each process
    differently; its stages all draw with the last stage's random state, which is seeded here."""
    ids, mask = prompts(model.config.vocab_size)
    tokens = {}
    for name, kwargs in CASES.items():
        torch.manual_seed(SEED + stages - 1)
        with torch.no_grad():
            tokens[name] = model.generate(input_ids=ids, attention_mask=mask, pad_token_id=PAD, **kwargs).tolist()
    return tokens


def one_process_grouped(model: transformers.PreTrainedModel) -> dict[str, list]:
    """The worker's grouped cases by the stock model in this process, the batch as one call."""
    ids, mask = four_prompts(model.config.vocab_size)
    tokens = {}
    with torch.no_grad():
        for name, kwargs in GROUPED.items():
            tokens[name] = model.generate(input_ids=ids, attention_mask=mask, pad_token_id=PAD, **kwargs).tolist()
        eos = tokens["greedy"][0][ids.shape[1] + 2]
        tokens["eos-at-step-3"] = model.generate(
            input_ids=ids, attention_mask=mask, pad_token_id=PAD, eos_token_id=eos, **GROUPED["greedy"]
        ).tolist()
    return tokens


def check_grouped(ranks: list[dict], model: transformers.PreTrainedModel) -> None:
    """Rows decoded in groups in flight: one process's greedy tokens on every process (an early end included), the
    same sampled tokens at each run with one seed, and a streamer handed each step of every row once."""
    want = one_process_grouped(model)
    prompt_length = four_prompts(model.config.vocab_size)[0].shape[1]
    for rank, record in enumerate(ranks):
        grouped = record["grouped"]
        assert {name: grouped[name] for name in want} == want, rank
        first, second = grouped["sampled-twice"]
        assert first == second and first == ranks[0]["grouped"]["sampled-twice"][0], rank
    ended = want["eos-at-step-3"]
    assert len(ended[0]) < len(want["greedy"][0]) or ended[0][-1] == PAD  # row 0 ended early ...
    assert PAD not in ended[2][prompt_length:]  # ... while the other group's rows ran on
    streamed = ranks[0]["grouped"]["streamed"]
    assert streamed["prompt_shape"] == [4, prompt_length] and streamed["ended"] == 1
    by_row = [list(row) for row in zip(*streamed["steps"], strict=True)]
    assert by_row == [row[prompt_length:] for row in ended]


def check_leader_stop(ranks: list[dict], model: transformers.PreTrainedModel) -> None:
    """A row ended by process 0 alone (`LeaderStop`) ends on every process at the same step, a prefix of its greedy
    tokens then padding; the other rows are one process's. As one group, it ends at the step process 0 chose."""
    want = one_process_grouped(model)["greedy"]
    prompt_length = four_prompts(model.config.vocab_size)[0].shape[1]
    for rank, record in enumerate(ranks):
        stopped = record["leader-stop"]
        assert stopped["groups-follower-criterion"] == (rank != 0), rank  # pickled without process 0's rows
        for name in ("groups", "one-group"):
            rows = stopped[name]
            assert rows == ranks[0]["leader-stop"][name], (rank, name)  # every process: the same rows, same steps
            assert [row for r, row in enumerate(rows) if r != STOPPED_ROW] == [
                row for r, row in enumerate(want) if r != STOPPED_ROW
            ], (rank, name)
            generated = rows[STOPPED_ROW][prompt_length:]
            kept = next((i for i, token in enumerate(generated) if token == PAD), len(generated))
            assert 1 <= kept < len(want[STOPPED_ROW]) - prompt_length, (rank, name, generated)
            assert generated == want[STOPPED_ROW][prompt_length:][:kept] + [PAD] * (len(generated) - kept)
        one, greedy = stopped["one-group"][STOPPED_ROW][prompt_length:], want[STOPPED_ROW][prompt_length:]
        assert one[: STOP_AFTER + 1] == greedy[: STOP_AFTER + 1] and one[STOP_AFTER + 1] == PAD


def check_joined(ranks: list[dict], model: transformers.PreTrainedModel) -> None:
    """Rows that join and leave the groups of continuous batching through the stages (`JOINED_PLAN`: a group idle at
    first, rows joining while others decode, one ending early, a group finishing before the other) get the greedy
    tokens of `generate()` alone."""
    got = ranks[0]["joined"]
    for prompt, ids in enumerate(JOINED_PROMPTS):
        with torch.no_grad():
            alone = model.generate(torch.tensor([ids]), max_new_tokens=JOINED_NEW, do_sample=False,
                                   pad_token_id=PAD, eos_token_id=None)[0, len(ids) :].tolist()  # fmt: skip
        assert got[str(prompt)] == alone[: JOINED_EARLY.get(prompt, JOINED_NEW)], prompt
    assert len({tuple(tokens) for tokens in got.values()}) == len(JOINED_PROMPTS), "identical rows would prove little"


def own_layers(layout: list[int]) -> list[set[int]]:
    starts = [sum(layout[:i]) for i in range(len(layout))]
    return [set(range(start, start + count)) for start, count in zip(starts, layout, strict=True)]


@pytest.mark.parametrize(
    ("family", "layout"),
    [("llama", [2, 2]), ("gpt2", [1, 3]), ("llama", [1, 2, 1])],
    ids=["llama-2-stages", "gpt2-2-stages-pipeline", "llama-3-stages"],
)
def test_generate_across_stages_gives_one_process_tokens(tmp_path, request, family, layout):
    model_dir = request.getfixturevalue(f"{family}_dir")
    ranks = run_stages(tmp_path / "stages", model_dir, layout)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    want = one_process_tokens(model, len(layout))
    for stage, record in enumerate(ranks):
        assert record["tokens"] == want, stage  # every case, every process: the tokens of one process
    assert want["sample"] != want["greedy"]  # sampling drew other tokens than the argmax
    assert len({t for row in want["greedy"] for t in row[6:]}) > 4, "degenerate outputs would prove little"
    assert ranks[0]["cache_class"]["greedy"] == "StaticCache"  # generate_static's default
    assert ranks[0]["cache_class"]["greedy-dynamic-cache"] == "DynamicCache"
    check_grouped(ranks, model)
    check_leader_stop(ranks, model)
    check_joined(ranks, model)
    assert all(record["groups"] == min(len(layout), 4) for record in ranks)  # one group per stage (4 rows)
    # each process's cache holds real keys and values for its own layers only; a layer of another stage that ran
    # before its own keeps one value per token and row (its lengths), one that never ran nothing
    per_layer = max(layer["bytes"] for layer in ranks[0]["cache"]["greedy"])
    for own, record in zip(own_layers(layout), ranks, strict=True):
        for name, layers in record["cache"].items():
            assert {layer["layer"] for layer in layers if layer["real"]} == own, name
            placeholders = sum(layer["bytes"] for layer in layers if not layer["real"])
            real = sum(layer["bytes"] for layer in layers if layer["real"])
            assert placeholders * 8 <= real * (len(layers) - len(own)) / len(own), name
        total = sum(layer["bytes"] for layer in record["cache"]["greedy"])
        assert total < per_layer * (len(own) + 0.5)  # its own share, not the whole model's
    if family == "gpt2":  # the text-generation pipeline, run by every process, equals transformers' own
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        theirs = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
        want_texts = [theirs(prompt, **PIPELINE_CALL) for prompt in PROMPTS]
        assert all(record["pipeline"] == want_texts for record in ranks)


def test_generate_on_stages_sharded_over_replicas_gives_one_process_tokens(tmp_path, llama_dir):
    """2 stages x 2 replicas, each stage sharded over its replicas (`--fsdp`): every process of both replicas gives
    one process's tokens (each unit gathered once, at the prefill, and resharded after the call)."""
    ranks = run_stages(tmp_path / "stages", llama_dir, [2, 2], "--fsdp")
    want = one_process_tokens(transformers.AutoModelForCausalLM.from_pretrained(llama_dir).eval(), 2)
    for rank, record in enumerate(ranks):
        assert record["tokens"] == want, rank
        assert "sharded over replicas" in record["joined-refused"], rank  # continuous batching: one line, no hang
