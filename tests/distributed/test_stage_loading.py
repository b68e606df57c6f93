"""Stage-local loading (`optimum_ipu.models.stage_loading.load_stage`): with pipeline stages on separate processes, each
process builds the model on the meta device and reads only its stage's tensors from the checkpoint. Training then
gives the same losses and weights, exactly, as the path that loads the whole model and frees what the stage does not
run, and those of one process; each process holds only what its stage runs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.models.layout import layers_per_stage
from optimum_ipu.runtime.stages.hold import held_parameter_names

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch, saved_weights
from . import fake_hub
from .pipeline_worker import tiny_for
from .test_fsdp_stages import one_process

WORKER = str(REPO_ROOT / "tests" / "distributed" / "stage_loading_worker.py")
STEPS = 3


def run_stages(out, config: dict, class_name: str, model_dir, mode: str) -> tuple[list[float], dict, list[dict]]:
    processes = len(config["layers_per_ipu"]) * config.get("replication_factor", 1)
    args = [str(out), json.dumps(config), str(STEPS), class_name, str(model_dir), mode]
    run = launch(*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}", WORKER, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(processes)]
    return json.loads((out / "losses.json").read_text()), load_file(out / "model.safetensors"), ranks


@pytest.mark.parametrize(
    ("class_name", "layout", "replicas", "shard_size"),
    [
        ("LlamaForCausalLM", [2, 2], 1, "20KB"),  # a sharded checkpoint: each stage opens the shards it needs
        ("GPT2LMHeadModel", [2, 2], 2, None),  # the output projection is the input embedding: both ends hold it
        ("T5ForConditionalGeneration", [1, 2, 1], 1, None),  # encoder end and decoder start on one stage; T5 biases
        ("BertForQuestionAnswering", [0, 2, 2], 1, None),  # a stage of embeddings only
    ],
    ids=["llama-sharded-checkpoint", "gpt2-tied-2x2", "t5-3-stages", "bert-embeddings-stage"],
)
def test_stage_local_equals_whole_then_freed(tmp_path, class_name, layout, replicas, shard_size):
    torch.manual_seed(0)
    model_dir = tmp_path / "pretrained"
    tiny_for(class_name).tiny_model(class_name).save_pretrained(model_dir, max_shard_size=shard_size or "5GB")
    config = {"layers_per_ipu": layout, "replication_factor": replicas, "gradient_accumulation_steps": len(layout)}
    got_losses, got, got_ranks = run_stages(tmp_path / "stage", config, class_name, model_dir, "stage")
    want_losses, want, want_ranks = run_stages(tmp_path / "whole", config, class_name, model_dir, "whole")
    assert got_losses == want_losses  # exactly
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert got_ranks == want_ranks  # the same bytes held by each process
    # and the numbers of one process running every stage in turn
    one_losses, one = one_process_from(model_dir, config, class_name)
    assert got_losses == pytest.approx(one_losses, abs=1e-5)
    for key, value in one.items():
        if key in got:
            torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)
    whole = sum(v.numel() * v.element_size() for v in one.values() if v.is_floating_point())
    assert max(r["parameter_bytes"] for r in got_ranks) < whole


def one_process_from(model_dir, config: dict, class_name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    import transformers

    model = getattr(transformers, class_name).from_pretrained(model_dir)
    tiny = tiny_for(class_name)
    original = tiny.tiny_model
    try:  # one_process builds its model with tiny_model: hand it the loaded one
        tiny.tiny_model = lambda name: model
        return one_process(config, class_name)
    finally:
        tiny.tiny_model = original


@pytest.mark.parametrize(
    ("class_name", "layout"),
    [("LlamaForCausalLM", [2, 2]), ("GPT2LMHeadModel", [1, 3]), ("T5ForConditionalGeneration", [1, 1, 1, 1])],
)
def test_each_parameter_is_held_by_a_stage_that_runs_it(class_name, layout):
    """Every parameter is held somewhere, a layer only by its stage, and the embeddings only where they start the
    hidden states (stage 0, an encoder-decoder's first decoder stage) or where a tied head uses them."""
    model = tiny_for(class_name).tiny_model(class_name)
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=layout))
    cut = pipelined.stage_cut()
    counts = layers_per_stage(pipelined.ipu_config, pipelined.num_layers, inference=False)
    held = [held_parameter_names(model, cut, counts, stage) for stage in range(len(layout))]
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    assert set().union(*held) == names
    for path in cut.layer_paths:  # T5's position table, which every stage's stand-ins borrow, aside
        own = {n for n in names if n.startswith(path + ".") and "relative_attention" not in n}
        holders = {s for s, h in enumerate(held) if own & h}
        assert len(holders) == 1, path
    embedding = model.get_input_embeddings().weight
    embedding_names = {n for n, p in model.named_parameters(remove_duplicate=False) if p is embedding}
    holders = [s for s, h in enumerate(held) if embedding_names & h]
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    assert holders[0] == 0
    if cut.encoder is None:  # a decoder alone: the embeddings on stage 0, and on the last stage only when tied
        assert holders == ([0, len(layout) - 1] if tied else [0])


# ------------------------------------------------------ through IPUTrainer (tests/distributed/fsdp_worker.py)
TRAINER_WORKER = str(REPO_ROOT / "tests" / "distributed" / "fsdp_worker.py")


def trainer_run(out, pretrained, processes: int, replicas: int, *flags: str, resume_from=None) -> dict:
    """The worker's tiny Llama, 2 stages, loaded from `pretrained`; evaluated and predicted before training, trained
    4 steps, evaluated again. One process when `processes` is 1 (the stages and replicas in turn)."""
    args = [TRAINER_WORKER, str(out), str(replicas), "4", "--stages", "--evaluate", *flags]
    launcher = [*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}"] if processes > 1 else []
    env = {"PRETRAINED": str(pretrained), "RESUME_FROM": str(resume_from or ""), "FAKE_HUB": f"{out}-hub"}
    run = launch(*(launcher or [TORCHRUN[0]]), *args, extra_env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((out / "rank0.json").read_text())


@pytest.fixture(scope="module")
def pretrained_llama(tmp_path_factory):
    from .fsdp_worker import tiny_llama

    folder = tmp_path_factory.mktemp("pretrained-llama")
    tiny_llama().save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("processes", "replicas", "flags"), [(2, 1, ()), (4, 2, ("--fsdp",))], ids=["2x1", "2x2-fsdp"])
def test_trainer_stage_local_predicts_as_one_process(tmp_path, pretrained_llama, processes, replicas, flags):
    """`optimum_ipu.AutoModelForCausalLM` under torchrun loads each stage alone; `IPUTrainer.evaluate()` / `predict()`
    then run forward through the stages (no process holds the whole model) and give one process's predictions; with
    one replica the batches are one process's, so the loss (perplexity) is equal too. The stages but the last collate
    other batches (`--skew`, as a random collator's draws would differ): every stage takes the last stage's, in
    training and evaluation."""
    got = trainer_run(
        tmp_path / "stages", pretrained_llama, processes, replicas, "--stage-local", "--skew", "--push", *flags
    )
    want = trainer_run(tmp_path / "one", pretrained_llama, 1, replicas)
    got_logits = torch.load(tmp_path / "stages" / "predictions_before.pt")
    want_logits = torch.load(tmp_path / "one" / "predictions_before.pt")
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)
    if replicas == 1:
        assert got["eval_before"]["before_loss"] == pytest.approx(want["eval_before"]["before_loss"], abs=1e-5)
        assert got["losses"] == pytest.approx(want["losses"], abs=1e-5)
    assert got["parameter_bytes"] < 0.6 * got["whole_parameter_bytes"]  # each process: its stage only
    # the trained model, gathered from the stages, is the stock layout
    import transformers

    final = tmp_path / "stages" / "final"
    shards = {p.name for p in final.glob("model-*.safetensors")}
    assert shards == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    model = transformers.AutoModelForCausalLM.from_pretrained(final)  # each stage wrote its shard: nothing gathered
    assert {n for n, _ in model.named_parameters()} == set(load_file(tmp_path / "one" / "final" / "model.safetensors"))
    # pushed to the (fake) Hub: each checkpoint's shards (hub_strategy="every_save"), then the final model, each
    # commit the stock sharded layout that from_pretrained loads whole; no checkpoint folder is uploaded
    pushed = fake_hub.commits(tmp_path / "stages-hub", "me/tiny-llama")
    assert not any(p.name.startswith("checkpoint-") for commit in pushed for p in commit.iterdir())
    sources = [tmp_path / "stages" / "checkpoint-3", tmp_path / "stages" / "checkpoint-4", final]
    for commit, source in zip(pushed, sources, strict=True):
        assert {p.name for p in commit.glob("model-*.safetensors")} == shards
        # each revision carries the IPUConfig it trained with, as the final push does
        assert (commit / "ipu_config.json").read_text() == (source / "ipu_config.json").read_text()
        want = saved_weights(source)
        got_pushed = transformers.AutoModelForCausalLM.from_pretrained(commit).state_dict()
        assert all(torch.equal(got_pushed[key], value) for key, value in want.items())
    # a stage-local run resumed from its step-3 checkpoint (each process reading its stage's shard) ends where the
    # uninterrupted run ended
    resumed = trainer_run(
        tmp_path / "resumed",
        pretrained_llama,
        processes,
        replicas,
        "--stage-local",
        "--skew",
        *flags,
        resume_from=tmp_path / "stages" / "checkpoint-3",
    )
    assert resumed["losses"][-1] == pytest.approx(got["losses"][-1], abs=1e-6)
    for key, value in saved_weights(final).items():
        torch.testing.assert_close(saved_weights(tmp_path / "resumed" / "final")[key], value, atol=1e-6, rtol=0)


def test_trainer_stage_local_keeps_the_best_checkpoint_and_rotates_the_others(tmp_path, pretrained_llama):
    """`save_total_limit=1` with `load_best_model_at_end` on stages loaded stage-local: checkpoints 3, 6 and 7 are
    written as parts (the constant learning rate overshoots on random tokens: the evaluation loss is lowest at step
    3); as with `Trainer`, the best is kept, the others go, and the model trained 7 steps ends with the best's weights,
    read back by each process from its stage's shard."""
    out = tmp_path / "best"
    env = {"PRETRAINED": str(pretrained_llama), "RESUME_FROM": ""}
    args = [TRAINER_WORKER, str(out), "1", "7", "--stages", "--stage-local", "--best"]
    run = launch(*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", *args, extra_env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    state = json.loads((out / "rank0.json").read_text())
    losses = {int(step): loss for step, loss in state["eval_losses"].items()}
    assert sorted(losses) == [3, 6, 7] and min(losses, key=losses.get) == 3, losses
    assert state["best_model_checkpoint"].endswith("checkpoint-3") and state["global_step"] == 7
    final, best_weights = saved_weights(out / "final"), saved_weights(out / "checkpoint-3")
    assert final.keys() == best_weights.keys()
    assert all(torch.equal(final[key], value) for key, value in best_weights.items())
    assert not all(torch.equal(final[key], value) for key, value in saved_weights(pretrained_llama).items())
