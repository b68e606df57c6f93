"""`generate()` and `pipeline("text-generation")` of a model whose stages run on separate processes, for
tests/distributed/test_generation_stages.py.

    torchrun --nproc_per_node N generation_worker.py OUT_DIR MODEL_DIR LAYERS_PER_IPU_JSON [--fsdp]

Each process loads its stage only (`optimum_ipu.AutoModelForCausalLM.from_pretrained(..., ipu_config=...)` under
torchrun), then runs every case of `CASES` on the same prompts (seeded as the test seeds its one-process run) and, when
MODEL_DIR has a tokenizer, the text-generation pipeline on `PROMPTS`. Every rank writes OUT_DIR/rank{r}.json: the
tokens of each case, the pipeline's results, and the bytes its KV cache held per layer after each case. With
`--fsdp`, 2 replicas of the stages, each stage sharded over its replicas (`fsdp.shard_stages`, as `--fsdp` trains).
"""

from __future__ import annotations

import json
import os
import pickle
import sys

import torch
import torch.distributed as dist
import transformers

import optimum_ipu
from optimum_ipu import IPUConfig
from optimum_ipu.errors import IncompatibleIPUConfigError
from optimum_ipu.models.generation import stage_generation
from optimum_ipu.pipelines import pipeline
from optimum_ipu.runtime.fsdp import shard_stages
from optimum_ipu.runtime.joined_rows import RowsControl, RowsSchedule
from optimum_ipu.runtime.lockstep import LeaderStop
from optimum_ipu.runtime.stages.hold import stage_hold
from tests.distributed.pipeline_worker import write_rank_record

SEED = 7
PAD = 0
CASES: dict[str, dict] = {
    "greedy": {"do_sample": False, "max_new_tokens": 8},
    "greedy-dynamic-cache": {"do_sample": False, "max_new_tokens": 8, "cache_implementation": "dynamic"},
    "beam": {"do_sample": False, "num_beams": 2, "num_return_sequences": 2, "max_new_tokens": 6},
    "sample": {"do_sample": True, "top_k": 8, "temperature": 1.5, "max_new_tokens": 8},
}
# Without return_dict_in_generate and beams, the rows decode in groups in flight (one per stage): greedy gives the
# tokens of one process (an early end included: "eos-at-step-3" ends row 0's group first), sampling with a seed the
# same tokens at every run.
GROUPED: dict[str, dict] = {
    "greedy": {"do_sample": False, "max_new_tokens": 8},
    "greedy-dynamic-cache": {"do_sample": False, "max_new_tokens": 8, "cache_implementation": "dynamic"},
    "greedy-n2": {"do_sample": True, "top_k": 1, "num_return_sequences": 2, "max_new_tokens": 5},
}
PROMPTS = ["The capital of France is", "Once upon a time", "the movie was"]
STOPPED_ROW, STOP_AFTER = 1, 2  # the row process 0 alone ends, once its criterion has been called STOP_AFTER times
PIPELINE_CALL = {"do_sample": False, "max_new_tokens": 5}


def prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 6 and 4 tokens, left-padded (as decoder-only models generate)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, vocab - 1, (2, 6), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = PAD, 0
    return ids, mask


def four_prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four prompts of 6, 4, 6 and 5 tokens, left-padded: two groups of two rows on 2 stages, 2 + 1 + 1 on 3."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, vocab - 1, (4, 6), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = PAD, 0
    ids[3, :1], mask[3, :1] = PAD, 0
    return ids, mask


class StepRecorder(transformers.generation.streamers.BaseStreamer):
    """What a streamer is handed: the prompts' shape, then each step's tokens of every row."""

    def __init__(self) -> None:
        self.prompt_shape: list[int] = []
        self.steps: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_shape:
            self.prompt_shape = list(value.shape)
        else:
            self.steps.append(value.tolist())

    def end(self) -> None:
        self.ended += 1


def grouped_cases(model: torch.nn.Module) -> dict:
    """The tokens of each grouped case; of greedy with an end-of-sequence token seen at row 0's third step; of
    sampling twice with one seed; and what a streamer saw of the greedy case."""
    ids, mask = four_prompts(model.config.vocab_size)
    record: dict = {}
    for name, kwargs in GROUPED.items():
        torch.manual_seed(SEED)
        record[name] = model.generate(input_ids=ids, attention_mask=mask, pad_token_id=PAD, **kwargs).tolist()
    eos = record["greedy"][0][ids.shape[1] + 2]
    record["eos-at-step-3"] = model.generate(
        input_ids=ids, attention_mask=mask, pad_token_id=PAD, eos_token_id=eos, **GROUPED["greedy"]
    ).tolist()
    sampled = []
    for _ in range(2):
        torch.manual_seed(SEED + dist.get_rank())  # each process's own state: the last stage's is shared
        sampled.append(model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=6).tolist())
    record["sampled-twice"] = sampled
    recorder = StepRecorder()
    model.generate(input_ids=ids, attention_mask=mask, pad_token_id=PAD, eos_token_id=eos, streamer=recorder,
                   **GROUPED["greedy"])  # fmt: skip
    record["streamed"] = {"prompt_shape": recorder.prompt_shape, "steps": recorder.steps, "ended": recorder.ended}
    return record


def leader_stop_cases(model: torch.nn.Module) -> dict:
    """Greedy over `four_prompts` with row `STOPPED_ROW` ended by process 0 alone: its `LeaderStop` holds the rows
    it ends, the other processes get the criterion pickled (as `Lockstep` sends a call's arguments), without them.
    Decoded in groups in flight, and as one group (`return_dict_in_generate`)."""
    ids, mask = four_prompts(model.config.vocab_size)
    record = {}
    for name, extra in {"groups": {}, "one-group": {"return_dict_in_generate": True}}.items():
        calls: list[int] = []

        def rows_done(rows: int, calls: list[int] = calls) -> list[bool]:
            calls.append(rows)
            return [r == STOPPED_ROW and len(calls) > STOP_AFTER for r in range(rows)]

        stop = LeaderStop(rows_done) if dist.get_rank() == 0 else pickle.loads(pickle.dumps(LeaderStop(rows_done)))
        criteria = transformers.StoppingCriteriaList([stop])
        output = model.generate(input_ids=ids, attention_mask=mask, pad_token_id=PAD, stopping_criteria=criteria,
                                **GROUPED["greedy"], **extra)  # fmt: skip
        record[name] = (output.sequences if extra else output).tolist()
        record[f"{name}-follower-criterion"] = stop.rows_done is None
    return record


# Continuous batching through the stages (`StageGeneration.decode_joined`): prompts join each group at given passes
# (group 1 passes its first turns with no row, then takes one) and rows end at JOINED_NEW tokens or sooner; group 1
# finishes before group 0, which goes on alone. Each prompt must get its own greedy tokens of `generate()` alone.
JOINED_PROMPTS = [[5, 6, 7], [9, 3, 9, 3, 9, 3, 9, 3, 9], [1, 2], [30, 31, 32, 33, 34, 35], [11, 12, 13, 14]]
JOINED_NEW = 7
JOINED_PLAN = {  # group -> pass -> prompts joining; then (prompt, tokens) of the rows that end early
    0: {0: [0, 1], 3: [3], 8: [4]},
    1: {2: [2]},
}
JOINED_EARLY = {1: 3}


class JoinedScript(RowsSchedule):
    """Process 0's schedule of `JOINED_PLAN` (each group's passes counted apart); `got` each prompt's tokens."""

    def __init__(self) -> None:
        self.passes: dict[int, int] = {}
        self.running: dict[int, list[int]] = {}
        self.got: dict[int, list[int]] = {}
        self.groups = 0

    def begin(self, groups: int) -> None:
        self.groups = groups
        self.passes = {g: 0 for g in range(groups)}
        self.running = {g: [] for g in range(groups)}

    def control(self, rows: int, group: int) -> RowsControl:
        assert rows == len(self.running[group])
        plan = JOINED_PLAN.get(group, {}) if group < 2 else {}
        done = lambda p: len(self.got[p]) >= JOINED_EARLY.get(p, JOINED_NEW)  # noqa: E731
        ends = [i for i, p in enumerate(self.running[group]) if done(p)]
        self.running[group] = [p for p in self.running[group] if not done(p)]
        joining = plan.pop(self.passes[group], [])
        self.passes[group] += 1
        self.running[group] += joining
        self.got.update({p: [] for p in joining})
        finished = not self.running[group] and not plan
        return RowsControl(ends, [JOINED_PROMPTS[p] for p in joining], [(0.0, 1.0)] * len(joining), finished)

    def tokens(self, joined: list[int] | None, stepped: list[int] | None, group: int) -> None:
        running = self.running[group]
        rows = running[len(running) - len(joined) :] if joined is not None else running
        for p, token in zip(rows, joined if joined is not None else stepped or [], strict=True):
            self.got[p].append(token)


def joined_cases(model: torch.nn.Module) -> dict:
    """`JOINED_PLAN` decoded through the stages: each prompt's tokens, on process 0 (the others follow)."""
    script = JoinedScript() if dist.get_rank() == 0 else None
    stage_generation(model).decode_joined(seed=SEED, schedule=script)
    return {str(p): tokens for p, tokens in script.got.items()} if script is not None else {}


def cache_bytes(cache: transformers.Cache) -> list[dict]:
    """Per layer of a KV cache: the bytes its keys and values hold, and whether they are real (more than the
    one-value placeholder a layer of another stage leaves)."""
    layers = getattr(cache, "self_attention_cache", cache).layers
    record = []
    for index, layer in enumerate(layers):
        if not getattr(layer, "is_initialized", False):
            record.append({"layer": index, "bytes": 0, "real": False})
            continue
        size = sum(t.numel() * t.element_size() for t in (layer.keys, layer.values))
        record.append({"layer": index, "bytes": size, "real": layer.keys.shape[-1] > 1})
    return record


def main() -> None:
    out, model_dir, layout = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    dist.init_process_group("gloo")
    fsdp = "--fsdp" in sys.argv[4:]
    config = IPUConfig(layers_per_ipu=layout, replication_factor=2 if fsdp else 1)
    model = optimum_ipu.AutoModelForCausalLM.from_pretrained(model_dir, ipu_config=config)
    if fsdp:
        hold = stage_hold(model.model)
        shard_stages(model.model, hold.cut, [len(r) for r in hold.ranges], hold.mesh)
    held = sum(p.numel() for p in model.model.parameters() if not p.is_meta)
    ids, mask = prompts(model.config.vocab_size)
    record: dict = {"tokens": {}, "cache": {}, "held_parameters": held}
    for name, kwargs in CASES.items():
        # a different state per process: the stages share the last one's (each replica its own last stage's)
        torch.manual_seed(SEED + dist.get_rank() % len(layout))
        output = model.generate(input_ids=ids, attention_mask=mask, return_dict_in_generate=True, **kwargs)
        record["tokens"][name] = output.sequences.tolist()
        record["cache"][name] = cache_bytes(output.cache)
        record.setdefault("cache_class", {})[name] = type(output.cache).__name__
    record["grouped"] = grouped_cases(model)
    record["leader-stop"] = leader_stop_cases(model)
    if fsdp:  # refused on every process, before any exchange (FSDP's gathered units are its hooks' shared state)
        try:
            joined_cases(model)
        except IncompatibleIPUConfigError as err:
            record["joined-refused"] = str(err)
    else:
        record["joined"] = joined_cases(model)
    record["groups"] = len(model._stage_generation._groups)  # the groups' process groups it made
    if os.path.exists(os.path.join(model_dir, "tokenizer_config.json")):
        pipe = pipeline("text-generation", model=model, tokenizer=model_dir, max_seq_length=16, batch_size=2)
        record["pipeline"] = pipe(PROMPTS, **PIPELINE_CALL)
    write_rank_record(out, record)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
