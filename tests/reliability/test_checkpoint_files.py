"""A model's tensors come only from the folder named (issue 42, item 1): the shards of an index resolve inside the
checkpoint's folder, never against the current directory, and an index entry that leaves the folder is refused."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from optimum_ipu.runtime.stages.checkpoint import checkpoint_index, read_state_dict
from optimum_ipu.runtime.stages.loading import load_held_tensors

from ..tiny_models import tiny_config


def _save_sharded(folder, seed: int) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(tiny_config("bert"))
    model.save_pretrained(folder, max_shard_size="20KB")  # several shards under model.safetensors.index.json
    assert (folder / "model.safetensors.index.json").is_file()
    return model


def _meta_model() -> transformers.PreTrainedModel:
    with torch.device("meta"):
        return transformers.BertForMaskedLM(tiny_config("bert"))


def test_shards_come_from_the_named_folder_not_the_current_one(tmp_path, monkeypatch):
    named = _save_sharded(tmp_path / "named", seed=0)
    _save_sharded(tmp_path / "elsewhere", seed=1)  # the same shard names, other values
    monkeypatch.chdir(tmp_path / "elsewhere")  # where an earlier save was left
    model = _meta_model()
    held = {name for name, _ in model.named_parameters()}
    missing = load_held_tensors(model, held, str(tmp_path / "named"), torch.device("cpu"))
    assert not missing
    for name, param in model.named_parameters():
        torch.testing.assert_close(param, dict(named.named_parameters())[name], msg=name)
    state = read_state_dict(str(tmp_path / "named"))  # a resume's reader too, given a relative folder
    monkeypatch.chdir(tmp_path)
    assert read_state_dict("named").keys() == state.keys()


@pytest.mark.parametrize("entry", ["../outside.safetensors", "/tmp/outside.safetensors", "a/../../b.safetensors", 7])
def test_an_index_entry_outside_the_folder_is_refused(tmp_path, entry):
    _save_sharded(tmp_path / "model", seed=0)
    index_file = tmp_path / "model" / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = entry
    index_file.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="is not a file of the checkpoint's folder") as error:
        checkpoint_index(str(tmp_path / "model"))
    assert "\n" not in str(error.value) and repr(entry) in str(error.value)
