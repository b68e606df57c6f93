"""Stages that balance themselves (issue 26, item 4): the exact partition over known costs, a model whose head costs
more than its layers (a tiny GPT-2 with a 30,000-token vocabulary) split accordingly from measured costs,
`layers_per_ipu: "auto"` resolved at parallelize time and trained, and `optimum-ipu config balance`."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.cli.main import main
from optimum_ipu.errors import IncompatibleIPUConfigError
from optimum_ipu.runtime.engine import Engine
from optimum_ipu.runtime.stages import balance
from optimum_ipu.runtime.step import run_steps


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread while timing: on a shared, loaded CPU a second thread's barrier waits swamp small ops."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def big_head_gpt2() -> transformers.GPT2LMHeadModel:
    """4 layers of width 64 and a 30,000-token head: the head's matmul and loss cost far more than all the layers."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=64,
        n_layer=4,
        n_head=2,
        vocab_size=30000,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config).train()


@pytest.mark.parametrize(
    ("seconds", "stages", "first", "last", "want"),
    [
        ([1, 1, 1, 1, 1, 1], 3, 0, 0, [2, 2, 2]),
        ([1, 1, 1, 1, 1, 1], 3, 0, 2.5, [3, 3, 0]),  # heads worth 2.5 layers: alone on the last stage
        ([1, 1, 1, 1, 1, 1], 3, 2.5, 0, [0, 3, 3]),  # embeddings worth 2.5 layers: alone on stage 0
        ([1, 1, 1, 1], 2, 0, 10, [4, 0]),  # heads alone on the last stage
        ([5, 1, 1, 1, 1, 1], 2, 0, 0, [1, 5]),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, 0, 0, [5, 2, 2]),  # 15 | 13 | 17: the linear partition's optimum, 17
    ],
)
def test_balanced_split_minimizes_the_slowest_stage(seconds, stages, first, last, want):
    got = balance.balanced_split(seconds, stages, first_seconds=first, last_seconds=last)
    assert got == want
    assert sum(got) == len(seconds)


def test_balanced_split_respects_memory():
    # time alone would put all 4 layers on stage 0; stage 0 holds only 2 layers' memory
    memory = lambda stage, start, stop: stop - start  # noqa: E731
    assert balance.balanced_split([1, 1, 1, 1], 2, last_seconds=10) == [4, 0]
    assert balance.balanced_split([1, 1, 1, 1], 2, last_seconds=10, memory=memory, memory_limit=2) == [2, 2]
    with pytest.raises(IncompatibleIPUConfigError, match="layers_per_ipu: no split of 4 layers over 2 stages"):
        balance.balanced_split([1, 1, 1, 1], 2, memory=memory, memory_limit=1)


def test_predicted_step_time():
    assert balance.predicted_step_seconds([1.0, 1.0, 1.0, 1.0], 8) == pytest.approx(11.0)  # (m + p - 1) x t
    assert balance.predicted_step_seconds([1.0, 3.0], 4) == pytest.approx(13.0)


def test_measured_costs_put_a_big_head_alone():
    model = big_head_gpt2()
    cut = to_pipelined(model, IPUConfig(layers_per_ipu=[-1, -1])).stage_cut()
    ids = torch.randint(0, 30000, (4, 64), generator=torch.Generator().manual_seed(0))
    costs = balance.measure_layer_costs(model, cut, {"input_ids": ids, "labels": ids}, repeats=3, warmup=1)
    assert len(costs.layers) == 4
    assert all(u.forward_s > 0 and u.activation_bytes > 0 for u in costs.layers)
    assert costs.heads.seconds > sum(u.seconds for u in costs.layers)  # 30,000 x 64 logits per token
    assert costs.layers[0].param_bytes == sum(p.numel() * 4 for p in model.transformer.h[0].parameters())
    # the tied output projection is held by the embeddings' stage and by the heads' stage
    assert costs.heads.param_bytes >= model.lm_head.weight.numel() * 4
    assert balance.split_for(costs, 2, micro_batches=4) == [4, 0]


def test_auto_layers_resolve_at_parallelize_and_train():
    config = IPUConfig.from_dict({"layers_per_ipu": "auto", "ipus_per_replica": 2, "gradient_accumulation_steps": 2})
    assert config.layers_per_ipu == [-1, -1] and config.to_dict()["layers_per_ipu"] == "auto"
    model = big_head_gpt2()
    ids = torch.randint(0, 30000, (4, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = float(model(input_ids=ids, labels=ids).loss)  # the stock model's loss, before any step
    pipelined = to_pipelined(model, config, parallelize=True)
    assert config.layers_per_ipu == [4, 0]
    assert [len(s.layers) for s in pipelined.stage_layout(inference=False)] == [4, 0]
    assert IPUConfig.from_dict(config.to_dict()).layers_per_ipu == [-1, -1]  # the file keeps "auto"
    engine = Engine(pipelined, config)
    sgd = torch.optim.SGD(pipelined.parameters(), lr=0.1)
    batch = {"input_ids": ids, "labels": ids}
    losses = [float(run_steps(engine, sgd, batch, micro_batches=2)[0]) for _ in range(2)]
    assert losses[0] == pytest.approx(want, abs=1e-4)  # two micro-batches of 2 rows, weighted alike
    assert losses[1] < losses[0]


def test_a_layout_set_after_auto_is_kept():
    config = IPUConfig.from_dict({"layers_per_ipu": "auto", "ipus_per_replica": 2})
    config.layers_per_ipu = [3, 1]
    assert config.to_dict()["layers_per_ipu"] == [3, 1] and config.to_dict()["inference_layers_per_ipu"] == "auto"
    config.update_from_string("inference_layers_per_ipu=[2 2]")
    assert config.to_dict()["inference_layers_per_ipu"] == [2, 2]


def test_auto_needs_the_number_of_stages():
    with pytest.raises(IncompatibleIPUConfigError, match='"auto" needs `ipus_per_replica`'):
        IPUConfig(layers_per_ipu="auto")


# an encoder-decoder too: the GPU check's t5_balance run, which CI no longer runs end to end
@pytest.mark.parametrize("model", ["tiny-gpt2-config", "tiny-t5-config"])
def test_config_balance_command(tmp_path, capsys, model):
    out = tmp_path / "balance.json"
    args = ["config", "balance", model, "--n-ipu", "2", "--seq-len", "16", "--repeats", "1"]
    assert main([*args, "--warmup", "1", "--measure-stages", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "layers_per_ipu balanced:" in printed and "predicted step time" in printed
    report = json.loads(out.read_text())
    layers = sum(report["even"]["layers_per_ipu"])
    assert sum(report["balanced"]["layers_per_ipu"]) == layers and report["even"]["layers_per_ipu"] == [layers // 2] * 2
    assert len(report["balanced"]["measured_stage_s"]) == 2
    assert report["balanced"]["predicted_step_s"] <= report["even"]["predicted_step_s"]


def test_config_balance_bad_model(tmp_path, capsys):
    assert main(["config", "balance", str(tmp_path / "nothing"), "--n-ipu", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MODEL" in err and "config.json" in err
