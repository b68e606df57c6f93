"""Tensor parallelism (`tensor_parallel_size`): each family of the issue split over 2 gloo processes gives the whole
model's loss and gradients (1e-5) and greedy tokens, each process holding about half the parameters; the plans
resolve to the model's modules; what cannot split says so in one line."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from optimum_ipu import IPUConfig
from optimum_ipu.errors import IncompatibleIPUConfigError
from optimum_ipu.models.pipelined import PipelinedModel
from optimum_ipu.models.stage_plan import StagePlan
from optimum_ipu.models.tensor_parallel import tensor_parallel_plan
from optimum_ipu.runtime.tensor_parallel import check_divisible

from ..conftest import PYTHON, REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from ..local_tokenizers import save_tiny_pretrained
from .tensor_parallel_worker import ADAM_EPS, ADAM_LR, tiny

WORKER = str(REPO_ROOT / "tests" / "distributed" / "tensor_parallel_worker.py")
FAMILIES = ("llama", "mistral", "qwen2", "gpt2", "bert", "roberta", "t5", "whisper", "opt", "xlm-roberta")


@pytest.fixture(scope="module")
def split_runs(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("tensor_parallel")
    run = launch(*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", WORKER, str(out), *FAMILIES)
    assert run.returncode == 0, run.stderr[-3000:]
    return {family: json.loads((out / f"{family}.json").read_text()) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_split_model_gives_the_whole_models_loss_and_gradients(split_runs, family):
    result = split_runs[family]
    assert result["split_parameters"] > 0
    assert result["loss_difference"] <= 1e-5, result
    assert result["gradient_difference"] <= 1e-5, result
    # a fused AdamW step over one group mixing split and whole parameters runs, tensor by tensor, as the whole model's:
    # its first step moves a weight by lr * g / (|g| + eps), whose slope in g is at most lr / eps, so gradients 1e-5
    # apart may move weights up to lr / eps * 1e-5 apart (1e-4: measured 1.3e-5 for GPT-2 on an AVX2-only CPU, 1e-5 or
    # less on AVX-512 ones); a step that mixed up tensors would move them by about lr (1e-2)
    assert result["step_difference"] <= ADAM_LR / ADAM_EPS * 1e-5, result
    assert result["mixed_groups"] == 1
    # every split matrix is halved; only norms, biases of row-wise layers and position tables stay whole
    assert all(held == result["held_bytes"] for held in result["held_bytes_by_rank"])
    assert result["held_bytes"] < 0.6 * result["whole_bytes"]
    if "generated_equal" in result:
        assert result["generated_equal"], result["generated"]
    # the inference split (plain shares, shared-memory exchanges): the whole model's outputs, to float rounding (GPT-2's
    # initializer_range 0.5 makes its residual stream large: 3.3e-5 on logits of 15, the others 1e-5 or less; a bias
    # added twice or a share misplaced is off by 0.1 or more) and greedy tokens
    inference = result["inference"]
    assert inference["dtensors"] == 0 and inference["difference"] <= 1e-5 * max(1.0, inference["scale"]), inference
    assert inference.get("generated_equal", True), inference


def test_plan_resolves_each_layer_and_the_tied_vocabulary():
    model, _ = tiny("t5")
    plan = tensor_parallel_plan(PipelinedModel(model, IPUConfig()), 2)
    # the position bias lives in each stack's first block only; cross attention in the decoder's blocks only
    biases = [path for path in plan.styles if path.endswith("relative_attention_bias")]
    assert biases == ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias",
                      "decoder.block.0.layer.0.SelfAttention.relative_attention_bias"]  # fmt: skip
    assert "decoder.block.1.layer.1.EncDecAttention.q" in plan.styles
    assert not any(path.startswith("encoder") and "EncDecAttention" in path for path in plan.styles)
    # the shared table and both stacks' embed_tokens (one weight) split by vocabulary rows, the head too
    vocabulary = {path: style for path, style in plan.styles.items() if style.startswith("vocabulary")}
    assert vocabulary == {
        "shared": "vocabulary_embedding",
        "encoder.embed_tokens": "vocabulary_embedding",
        "decoder.embed_tokens": "vocabulary_embedding",
        "lm_head": "vocabulary_head",
    }
    assert "decoder.block.1.layer.1.EncDecAttention.n_heads" in plan.divided
    assert plan.counts["num_heads"] == 4 and plan.counts["vocab_size"] == 128


def test_a_size_that_does_not_divide_the_heads_is_one_line():
    model, _ = tiny("llama")
    plan = tensor_parallel_plan(PipelinedModel(model, IPUConfig()), 3)
    with pytest.raises(IncompatibleIPUConfigError) as error:
        check_divisible(plan, 3)
    message = str(error.value)
    assert "\n" not in message
    assert "`tensor_parallel_size` 3" in message and "num_attention_heads=4" in message and "[1, 2, 4]" in message


def test_a_family_without_a_split_says_why():
    model = transformers.DistilBertForMaskedLM(
        transformers.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=48)
    )
    with pytest.raises(IncompatibleIPUConfigError, match=r"DistilBertForMaskedLM cannot split its layers.*size 1"):
        tensor_parallel_plan(PipelinedModel(model, IPUConfig()), 2)


def test_an_odd_vocabulary_is_refused_with_the_padding_fix():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=63))
    plan = tensor_parallel_plan(PipelinedModel(model, IPUConfig()), 2)
    with pytest.raises(IncompatibleIPUConfigError, match=r"vocab_size=63.*pad_to_multiple_of=2\)$"):
        check_divisible(plan, 2)


def test_a_plan_with_an_unknown_style_is_refused():
    with pytest.raises(ValueError, match="tensor_parallel"):
        StagePlan(family="x", classes=("X",), embeddings=(), layers=("layers",), tensor_parallel={"fc1": "diagonal"})


# ---------------------------------------------------------------------------------------------- IPUTrainer
TRAINER_WORKER = str(REPO_ROOT / "tests" / "distributed" / "fsdp_worker.py")


def train(out, processes: int, replicas: int, *flags: str, resume_from=None) -> list[dict]:
    """fsdp_worker.py's tiny Llama trained 4 steps with `tensor_parallel_size=2` (checkpoint at step 3)."""
    command = (
        (PYTHON,) if processes == 1 else (*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}")
    )
    args = (TRAINER_WORKER, str(out), str(replicas), "4", "--tp", *flags)
    run = launch(*command, *args, extra_env={"RESUME_FROM": str(resume_from or "")})
    assert run.returncode == 0, run.stderr[-3000:]
    if processes == 1:  # one process runs the shares in turn: the whole model, said once
        assert run.stderr.count("tensor_parallel_size 2 in one process") == 1
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(processes)]


def assert_same_weights(got_folder, want_folder, atol: float) -> None:
    got, want = load_file(got_folder / "model.safetensors"), load_file(want_folder / "model.safetensors")
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=atol, rtol=0, msg=key)


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    return out, train(out, 1, 1, "--evaluate", "--serialized")[0]


def test_trainer_splits_each_layer_over_two_processes(tmp_path, one_process_run):
    reference, want = one_process_run
    got = train(tmp_path, 2, 1, "--evaluate", "--serialized")
    assert all(r["mesh"] == [["dp", "pp", "tp"], [1, 1, 2]] for r in got)
    # Optimum Graphcore's serialized embedding: chunks in one process, the vocabulary split over the 2 processes here
    assert want["embedding"] == "SerializedEmbedding" and not want["embedding_split"]
    assert all(r["embedding"] == "Embedding" and r["embedding_split"] for r in got)
    torch.testing.assert_close(got[0]["losses"], want["losses"], atol=1e-5, rtol=0)
    assert len(want["losses"]) == 4
    for rank in got:  # every process evaluates the replica's batches and reports the model's loss
        assert abs(rank["eval"]["eval_loss"] - want["eval"]["eval_loss"]) < 1e-5
    predictions = torch.load(tmp_path / "predictions_before.pt")
    torch.testing.assert_close(predictions, torch.load(reference / "predictions_before.pt"), atol=1e-5, rtol=0)
    assert all(r["parameter_bytes"] < 0.55 * want["parameter_bytes"] for r in got)  # norms alone stay whole
    # saved whole, in the one-process layout (Adam's first steps magnify 1e-7 differences of the gradients)
    for saved in ("final", "checkpoint-3"):
        assert_same_weights(tmp_path / saved, reference / saved, atol=2e-5)


def test_trainer_resumes_a_one_process_checkpoint_split(tmp_path, one_process_run):
    reference, want = one_process_run
    got = train(tmp_path, 2, 1, resume_from=reference / "checkpoint-3")
    assert got[0]["global_step"] == 4
    torch.testing.assert_close(got[0]["losses"][-1], want["losses"][-1], atol=1e-5, rtol=0)
    assert_same_weights(tmp_path / "final", reference / "final", atol=1e-5)


def test_replicas_of_split_layers_are_sharded_over_the_replicas(tmp_path_factory):
    reference, split = tmp_path_factory.mktemp("one2"), tmp_path_factory.mktemp("dp2tp2")
    (want,), got = train(reference, 1, 2), train(split, 4, 2)
    assert all(r["mesh"] == [["dp", "pp", "tp"], [2, 1, 2]] for r in got)
    torch.testing.assert_close(got[0]["losses"], want["losses"], atol=1e-5, rtol=0)
    # split in two by tensor parallelism, then in two by FSDP2 over the replicas: a quarter each
    assert all(r["parameter_bytes"] < 0.3 * want["parameter_bytes"] for r in got)
    assert_same_weights(split / "final", reference / "final", atol=5e-5)


def test_split_stages_on_four_processes_give_one_process_numbers(tmp_path_factory):
    """tp=2 x pp=2: two pipeline stages, each split over 2 processes (mesh (1, 2, 2))."""
    reference, split = tmp_path_factory.mktemp("one_stages"), tmp_path_factory.mktemp("tp2pp2")
    (want,), got = train(reference, 1, 1, "--stages", "--evaluate"), train(split, 4, 1, "--stages", "--evaluate")
    assert all(r["mesh"] == [["dp", "pp", "tp"], [1, 2, 2]] for r in got)
    torch.testing.assert_close(got[0]["losses"], want["losses"], atol=1e-5, rtol=0)
    # the stages' predictions, the model's (the evaluation loss is not compared: each tensor-parallel pair evaluates
    # its share of the rows in batches of its own, and a token-level loss's mean depends on how rows are batched)
    predictions = torch.load(split / "predictions_before.pt")
    torch.testing.assert_close(predictions, torch.load(reference / "predictions_before.pt"), atol=1e-5, rtol=0)
    for saved in ("final", "checkpoint-3"):
        assert_same_weights(split / saved, reference / saved, atol=2e-5)
    # the gradient norm over the whole model: each split matrix's shares counted once, each stage's once
    norms = [
        json.loads((d / "checkpoint-3" / "trainer_state.json").read_text())["log_history"] for d in (split, reference)
    ]
    got_norms, want_norms = ([e["grad_norm"] for e in log if "grad_norm" in e] for log in norms)
    torch.testing.assert_close(got_norms, want_norms, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- pipeline()
PIPELINE_WORKER = str(REPO_ROOT / "tests" / "distributed" / "tensor_parallel_pipeline_worker.py")


@pytest.mark.parametrize(
    "class_name, sizes", [("LlamaForCausalLM", {"intermediate_size": 64}), ("GPT2LMHeadModel", {"n_inner": 64})]
)
def test_pipeline_split_over_two_processes_generates_one_process_text(tmp_path, tokenizer_for, class_name, sizes):
    # GPT-2's byte-level tokenizer; tokens that vary from step to step. The split decodes with plain shares and
    # shared-memory exchanges (`local_shards`): Llama's linears; GPT-2's Conv1D, fused query|key|value, row-wise
    # biases added once, and its output projection tied to the embedding
    model_dir = save_tiny_pretrained(
        tmp_path / "model", class_name, tokenizer_for("gpt2"), initializer_range=0.5, **sizes
    )
    weights = load_file(model_dir / "model.safetensors")  # biases that count (GPT-2 starts them at zero)
    torch.manual_seed(1)
    biases = {k: torch.randn_like(v) * 0.5 for k, v in weights.items() if k.endswith(("c_attn.bias", "c_proj.bias"))}
    save_file({**weights, **biases}, model_dir / "model.safetensors", metadata={"format": "pt"})
    assert len(biases) == (12 if class_name.startswith("GPT2") else 0)  # 4 layers: c_attn, attn and mlp c_proj
    one, split = tmp_path / "one", tmp_path / "split"
    one.mkdir(), split.mkdir()
    alone = launch(PYTHON, PIPELINE_WORKER, str(one), str(model_dir))
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert alone.stderr.count("inference_tensor_parallel_size 2 in one process") == 1
    run = launch(
        *TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", PIPELINE_WORKER, str(split), str(model_dir)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    want = json.loads((one / "rank0.json").read_text())
    got = [json.loads((split / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert not want["split"] and all(r["split"] for r in got)
    assert all(r["texts"] == want["texts"] for r in got)
    assert len(set(want["texts"])) == 3  # three prompts, three continuations


def test_a_derived_plan_without_a_known_layout_runs_whole_and_says_why(caplog):
    config = transformers.GPTNeoXConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48
    )
    model = transformers.GPTNeoXForCausalLM(config)  # fused query_key_value: no layout a derived plan splits
    with caplog.at_level("WARNING"):
        plan = tensor_parallel_plan(PipelinedModel(model, IPUConfig()), 2)
    assert dict(plan.styles) == {}  # nothing split: each process holds and runs the whole model
    said = [r.getMessage() for r in caplog.records if "runs whole on each of the 2 processes" in r.getMessage()]
    assert len(said) == 1 and "none of the layouts it splits" in said[0] and "GPTNeoXLayer" in said[0]
