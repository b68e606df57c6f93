"""Parameter-efficient fine-tuning: a `peft` LoRA model through `IPUTrainer` equals `peft` + `transformers.Trainer`
(losses and adapter weights), only the adapters train, and saved models are peft's adapter files."""

from __future__ import annotations

import json

import datasets
import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments, to_pipelined

from .conftest import PYTHON, REPO_ROOT
from .distributed.fsdp_worker import tiny_llama
from .helpers import SHORT_RUN, TORCHRUN, free_port, launch
from .tiny_models import tiny_inputs, tiny_model

peft = pytest.importorskip("peft", reason='the peft extra: pip install "optimum-ipu[peft]"')
from safetensors.torch import load_file  # noqa: E402

# class -> (LoRA's target modules, peft's task type)
LORA_MODELS = {
    "LlamaForCausalLM": (["q_proj", "v_proj"], "CAUSAL_LM"),
    "GPT2LMHeadModel": (["c_attn"], "CAUSAL_LM"),
    "BertForSequenceClassification": (["query", "value"], "SEQ_CLS"),
}
TWO_STAGES = {"layers_per_ipu": [2, 2], "ipus_per_replica": 2}


def lora_model(class_name: str) -> peft.PeftModel:
    """The tiny model of `class_name` with LoRA adapters (rank 4, no dropout), the same for the same class."""
    targets, task = LORA_MODELS[class_name]
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=targets,
        task_type=task,
        fan_in_fan_out=class_name[:4] == "GPT2",
    )
    torch.manual_seed(3)  # LoRA's A matrices are random
    return peft.get_peft_model(tiny_model(class_name), config)


def train_dataset(class_name: str) -> datasets.Dataset:
    return datasets.Dataset.from_dict({k: v.tolist() for k, v in tiny_inputs(class_name, batch=16).items()})


def losses(trainer: transformers.Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


@pytest.fixture(scope="module", params=list(LORA_MODELS))
def stock_run(request, tmp_path_factory) -> tuple[str, list[float], dict[str, torch.Tensor]]:
    """Stock `peft` + `transformers.Trainer`: 4 optimizer steps of 2 micro-batches of 2."""
    class_name = request.param
    out = tmp_path_factory.mktemp("stock")
    args = transformers.TrainingArguments(
        str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=4, **SHORT_RUN
    )
    trainer = transformers.Trainer(lora_model(class_name), args, train_dataset=train_dataset(class_name))
    if LORA_MODELS[class_name][1] == "SEQ_CLS":
        # A loss that is a mean over examples: Trainer, passing num_items_in_batch to a model that takes it, would not
        # divide it by the accumulation (twice the step's mean here); IPUTrainer weighs it as one big batch.
        trainer.model_accepts_loss_kwargs = False
    if class_name.startswith("GPT2"):
        # Trainer counts a causal LM's loss items over labels[..., 1:] (transformers#46204) where the model's
        # `loss_type` says causal; GPT-2's head has none, so its loss came out scaled by shifted / unshifted tokens.
        # IPUTrainer counts them shifted, as GPT-2's plan says its loss is causal.
        trainer._loss_shifts_labels = True
    trainer.train()
    return class_name, losses(trainer), trainable(trainer.model)


@pytest.mark.parametrize("layout", [{}, TWO_STAGES], ids=["one-stage", "two-stages"])
def test_lora_trains_as_stock_peft(stock_run, layout, tmp_path):
    class_name, stock_losses, stock_weights = stock_run
    model = lora_model(class_name)
    frozen = {k: v.detach().clone() for k, v in model.named_parameters() if not v.requires_grad}
    args = IPUTrainingArguments(str(tmp_path), per_device_train_batch_size=2, max_steps=4, **SHORT_RUN)
    config = IPUConfig(gradient_accumulation_steps=2, **layout)
    trainer = IPUTrainer(model, config, args, train_dataset=train_dataset(class_name))
    trainer.train()
    assert len(losses(trainer)) == len(stock_losses) == 4
    torch.testing.assert_close(losses(trainer), stock_losses, atol=1e-5, rtol=0)
    ours = trainable(trainer.model)
    assert sorted(ours) == sorted(stock_weights) and all("lora_" in k or "classifier" in k for k in ours)
    for key, value in stock_weights.items():
        torch.testing.assert_close(ours[key], value, atol=1e-5, rtol=0, msg=key)
    for key, value in frozen.items():  # only the adapters (and a classifier's head) trained
        assert torch.equal(dict(trainer.model.named_parameters())[key], value), key


def test_saved_model_is_peft_adapter_and_loads_back(tmp_path):
    class_name = "LlamaForCausalLM"
    args = IPUTrainingArguments(
        str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=2,
        **{**SHORT_RUN, "save_strategy": "steps"},
        save_steps=2,
    )
    trainer = IPUTrainer(lora_model(class_name), IPUConfig(**TWO_STAGES), args, train_dataset=train_dataset(class_name))
    trainer.train()
    trainer.save_model()
    for folder in (tmp_path, tmp_path / "checkpoint-2"):
        names = {p.name for p in folder.iterdir()}
        assert {"adapter_model.safetensors", "adapter_config.json", "ipu_config.json"} <= names, names
        assert "model.safetensors" not in names
        assert json.loads((folder / "adapter_config.json").read_text())["peft_type"] == "LORA"
    saved = load_file(tmp_path / "adapter_model.safetensors")
    assert saved and all("lora_" in key for key in saved)
    reloaded = peft.PeftModel.from_pretrained(tiny_model(class_name), str(tmp_path))
    for key, value in trainable(trainer.model).items():
        torch.testing.assert_close(dict(reloaded.named_parameters())[key], value, atol=0, rtol=0, msg=key)


def test_pipelined_layers_are_found_through_the_peft_wrapper():
    pipelined = to_pipelined(lora_model("LlamaForCausalLM"), IPUConfig(**TWO_STAGES))
    assert pipelined.plan.family == "llama"
    assert pipelined.layer_paths() == [f"base_model.model.model.layers.{i}" for i in range(4)]


def test_stages_on_two_processes_equal_one_process(tmp_path):
    """LoRA on a tiny Llama in 2 pipeline stages: a stage per gloo process gives the losses and saved adapters of one
    process running both stages in turn; each process loading only its stage (the base model never whole, LoRA
    wrapping the stage-local model) gives the losses of the processes that loaded it whole exactly, and their adapters
    to 1e-6 (the held stages' gradient norm is summed in another order)."""
    worker = str(REPO_ROOT / "tests" / "distributed" / "peft_worker.py")
    tiny_llama().save_pretrained(tmp_path / "base")
    one = launch(PYTHON, worker, str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch(*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", worker, str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    local = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        worker,
        str(tmp_path / "local"),
        "--from",
        str(tmp_path / "base"),
    )
    assert local.returncode == 0, local.stderr[-3000:]
    for run, meta in (("two", False), ("local", True)):
        assert all(
            json.loads((tmp_path / run / f"rank{r}.json").read_text())["other_stages_on_meta"] is meta for r in (0, 1)
        )
    want, got = (json.loads((tmp_path / run / "losses.json").read_text()) for run in ("two", "local"))
    assert got == want
    want, got = (load_file(tmp_path / run / "final" / "adapter_model.safetensors") for run in ("two", "local"))
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-6, rtol=0, msg=key)
    want, got = (json.loads((tmp_path / run / "losses.json").read_text()) for run in ("one", "two"))
    assert len(got) == 3
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    want, got = (load_file(tmp_path / run / "final" / "adapter_model.safetensors") for run in ("one", "two"))
    assert got.keys() == want.keys() and len(got) == 16  # A and B of q_proj and v_proj in 4 layers: both stages'
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)
    assert all(value.abs().max() > 0 for key, value in got.items() if "lora_B" in key)  # every layer's trained
    names = {p.name for p in (tmp_path / "two" / "checkpoint-2").iterdir()}  # the optimizer state of both stages
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"} <= names, names
    want, got = (torch.load(tmp_path / run / "checkpoint-2" / "optimizer.pt")["state"] for run in ("one", "two"))
    assert got.keys() == want.keys() and len(got) == 16  # the adapters' Adam moments, of both stages
    for index, state in want.items():
        for key, value in state.items():
            torch.testing.assert_close(got[index][key], value, atol=1e-5, rtol=0, msg=f"{index} {key}")


def _two_processes_equal_one(tmp_path, flag: str) -> None:
    """peft_worker.py with `flag` in one process and on 2 gloo processes (their parameters DTensors): the same losses
    and saved adapters."""
    worker = str(REPO_ROOT / "tests" / "distributed" / "peft_worker.py")
    one = launch(PYTHON, worker, str(tmp_path / "one"), flag)
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch(*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", worker, str(tmp_path / "two"), flag)
    assert two.returncode == 0, two.stderr[-3000:]
    assert all(json.loads((tmp_path / "two" / f"rank{r}.json").read_text())["sharded"] for r in (0, 1))
    want, got = (json.loads((tmp_path / run / "losses.json").read_text()) for run in ("one", "two"))
    assert len(got) == 3
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    want, got = (load_file(tmp_path / run / "final" / "adapter_model.safetensors") for run in ("one", "two"))
    assert got.keys() == want.keys() and len(got) == 16
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)


def test_fsdp_over_two_processes_equals_one_process(tmp_path):
    """LoRA on a tiny Llama, 2 replicas: `--fsdp` over 2 gloo processes (parameters sharded) gives the losses and saved
    adapters of one process running the replicas in turn."""
    _two_processes_equal_one(tmp_path, "--fsdp")
    assert (tmp_path / "two" / "checkpoint-2" / "adapter_model.safetensors").is_file()


def test_split_over_two_processes_equals_one_process(tmp_path):
    """LoRA on q_proj and v_proj of a tiny Llama split over 2 gloo processes (`tensor_parallel_size=2`: each adapter's B
    split with its column-wise base): the losses and saved adapters of one process."""
    _two_processes_equal_one(tmp_path, "--tp")


@pytest.mark.parametrize("flags", [[], ["--fsdp"], ["--fsdp", "--stages"]], ids=["stages", "fsdp", "fsdp-stages"])
def test_resumed_from_an_adapter_checkpoint_on_processes_ends_as_uninterrupted(tmp_path, flags):
    """A run on 2 processes (a stage each, or --fsdp shards) or 4 (--fsdp on 2 stages) resumed from the adapter
    checkpoint of step 2 ends with the uninterrupted run's adapters: the adapters and their optimizer state are read
    back, the base weights kept."""
    worker = str(REPO_ROOT / "tests" / "distributed" / "peft_worker.py")
    torchrun = [*TORCHRUN, f"--nproc_per_node={4 if '--stages' in flags else 2}"]
    full = launch(*torchrun, f"--master_port={free_port()}", worker, str(tmp_path / "full"), *flags)
    assert full.returncode == 0, full.stderr[-3000:]
    resumed = launch(
        *torchrun,
        f"--master_port={free_port()}",
        worker,
        str(tmp_path / "resumed"),
        *flags,
        extra_env={"RESUME_FROM": str(tmp_path / "full" / "checkpoint-2")},
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = (load_file(tmp_path / run / "final" / "adapter_model.safetensors") for run in ("full", "resumed"))
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-6, rtol=0, msg=key)


def test_fsdp_on_stages_trains_and_saves_as_one_process(tmp_path):
    """LoRA on a tiny Llama, 2 stages x 2 replicas sharded (`--fsdp`, 4 gloo processes): one process's losses, and
    peft's adapter files, each stage's adapters gathered to the main process."""
    worker = str(REPO_ROOT / "tests" / "distributed" / "peft_worker.py")
    one = launch(PYTHON, worker, str(tmp_path / "one"), "--fsdp", "--stages")
    assert one.returncode == 0, one.stderr[-3000:]
    four = launch(
        *TORCHRUN,
        "--nproc_per_node=4",
        f"--master_port={free_port()}",
        worker,
        str(tmp_path / "four"),
        "--fsdp",
        "--stages",
    )
    assert four.returncode == 0, four.stderr[-3000:]
    assert all(json.loads((tmp_path / "four" / f"rank{r}.json").read_text())["sharded"] for r in range(4))
    want, got = (json.loads((tmp_path / run / "losses.json").read_text()) for run in ("one", "four"))
    assert len(got) == 3
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for folder in ("final", "checkpoint-2"):
        names = {p.name for p in (tmp_path / "four" / folder).iterdir()}
        assert {
            "adapter_model.safetensors",
            "adapter_config.json",
        } <= names and "model.safetensors.index.json" not in names
    want, got = (load_file(tmp_path / run / "final" / "adapter_model.safetensors") for run in ("one", "four"))
    assert got.keys() == want.keys() and len(got) == 16
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)
