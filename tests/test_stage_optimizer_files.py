"""The file of one stage's optimizer state (`optimum_ipu.runtime.stages.optimizer`): safetensors, nothing pickled, read
back as written, and a damaged file named in the error. (Written and read by stages on processes:
tests/distributed/test_fsdp_stages.py.)"""

from __future__ import annotations

import pytest
import torch

from optimum_ipu.runtime.stages.optimizer import optimizer_file, read_state, write_state


def adamw_state() -> tuple[dict, list]:
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    adamw = torch.optim.AdamW(layer.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    layer(torch.randn(2, 4)).sum().backward()
    adamw.step()
    names = {p: n for n, p in layer.named_parameters()}
    state = {names[p]: dict(s) for p, s in adamw.state.items()}
    state["weight"]["note"] = "not a tensor"  # a state value of another kind travels as JSON
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": list(names.values())} for g in adamw.param_groups
    ]
    return state, groups


def test_a_stage_state_reads_back_as_written(tmp_path):
    state, groups = adamw_state()
    path = str(tmp_path / optimizer_file(0, 2))
    assert path.endswith("optimizer-00001-of-00002.safetensors")
    write_state(path, state, groups)
    got_state, got_groups = read_state(path)
    assert got_state.keys() == state.keys()
    for name, entries in state.items():
        assert got_state[name].keys() == entries.keys()
        for key, value in entries.items():
            if torch.is_tensor(value):
                assert torch.equal(got_state[name][key], value), (name, key)
            else:
                assert got_state[name][key] == value
    assert got_groups[0]["lr"] == 1e-3 and tuple(got_groups[0]["betas"]) == (0.9, 0.98)
    assert got_groups[0]["params"] == ["weight", "bias"]


def test_a_damaged_stage_state_names_its_file(tmp_path):
    state, groups = adamw_state()
    path = tmp_path / optimizer_file(1, 2)
    write_state(str(path), state, groups)
    path.write_bytes(path.read_bytes()[:40])  # cut short, as a crash mid-write would leave it
    with pytest.raises(
        ValueError, match=r"optimizer-00002-of-00002\.safetensors: this stage's optimizer state is damaged"
    ):
        read_state(str(path))
