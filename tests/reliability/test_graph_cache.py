"""The ONNX Runtime graph cache cannot serve a stale or damaged graph (issue 28, item 1): its key covers the model's
code (a class of the same name whose code changed, in its own method or in a helper of its module, gets a new
entry), entries are written atomically by each writer under a name of its own (two processes building one entry at
once both succeed and leave one whole entry), and an entry whose file was truncated or corrupted after it was
written is rebuilt with one warning, for `backend="onnxruntime"` and `"auto"` alike."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import random
import sys
from pathlib import Path

import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.graph_cache import MANIFEST, entry_problem
from optimum_ipu.runtime.inference.onnx import OnnxRuntimeModel
from optimum_ipu.runtime.inference.runner import InferenceRunner

from ..processes import zygote

NAMES = ["input_ids", "attention_mask"]
DAMAGED = "is stale or damaged"


def _ours(records: list[logging.LogRecord]) -> list[str]:
    """Our warnings (ONNX Runtime's optimizer logs its own through `logging` too)."""
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING and r.name.startswith("optimum_ipu")]


USER_MODULE = """
import transformers


def scale(logits):
    return logits * {helper}


class UserModel(transformers.BertForSequenceClassification):
    def forward(self, input_ids=None, attention_mask=None):
        logits = super().forward(input_ids=input_ids, attention_mask=attention_mask).logits
        return {{"logits": scale(logits) + {method}}}
"""


def _config() -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37
    )


def _user_model(folder: Path, helper: float, method: float) -> torch.nn.Module:
    """`UserModel` of module `user_model`, written to `folder` with these constants and imported afresh: the same
    class and module names each time, other code."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "user_model.py"
    path.write_text(USER_MODULE.format(helper=helper, method=method))
    spec = importlib.util.spec_from_file_location("user_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["user_model"] = module
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.UserModel(_config()).eval()


def _eager(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)["logits"]


def _inputs(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 99, (2, 9), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("change", ["method", "helper"])
def test_changed_code_gets_a_new_entry(tmp_path, reliability, change):
    """A model whose code changed (same class name, module name, config and weights) is exported again and answers
    as its own eager forward, not as the cached graph of the old code."""
    rng = random.Random(change)
    first = {"helper": round(rng.uniform(0.5, 2), 3), "method": round(rng.uniform(-1, 1), 3)}
    second = {**first, change: first[change] + round(rng.uniform(0.5, 3), 3)}
    cache, inputs = str(tmp_path / "cache"), _inputs(rng.randrange(1000))
    old = _user_model(tmp_path / "old", **first)
    old_ort = OnnxRuntimeModel(old, NAMES, cache_dir=cache, optimize=False)
    new = _user_model(tmp_path / "new", **second)
    assert type(new).__qualname__ == type(old).__qualname__ and type(new).__module__ == type(old).__module__
    new_ort = OnnxRuntimeModel(new, NAMES, cache_dir=cache, optimize=False)
    assert new_ort.path != old_ort.path
    torch.testing.assert_close(new_ort(**inputs)["logits"], _eager(new, inputs), atol=1e-4, rtol=0)
    assert not torch.allclose(_eager(new, inputs), _eager(old, inputs), atol=1e-2)
    # the same code again (imported afresh from another file of equal bytes) finds the first entry
    again = _user_model(tmp_path / "again", **first)
    assert OnnxRuntimeModel(again, NAMES, cache_dir=cache, optimize=False).path == old_ort.path
    reliability.cache_verified()


HELPER_MODULE = "def scale(logits):\n    return logits * {factor}\n"
CALLER_MODULE = """
import transformers
from graph_helpers import scale


class CallerModel(transformers.BertForSequenceClassification):
    def forward(self, input_ids=None, attention_mask=None):
        return {"logits": scale(super().forward(input_ids=input_ids, attention_mask=attention_mask).logits)}
"""


def _caller_model(folder: Path, factor: float) -> torch.nn.Module:
    """`CallerModel`, whose forward calls `scale` of another module (`graph_helpers`), rewritten in place with
    `factor`: the model's own files stay the same bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph_helpers.py").write_text(HELPER_MODULE.format(factor=factor))
    (folder / "graph_caller.py").write_text(CALLER_MODULE)
    modules = {}
    for name in ("graph_helpers", "graph_caller"):  # imported afresh, the helper first
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        modules[name] = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    torch.manual_seed(0)
    return modules["graph_caller"].CallerModel(_config()).eval()


def test_a_helper_in_another_module_edited_between_runs_is_not_served_stale(tmp_path, reliability, caplog):
    """The key covers the files of the model's classes; a helper of another module that the forward calls is
    recorded when the graph is built, and an edit of it makes the entry stale (issue 42, item 3)."""
    factor = round(random.Random(3).uniform(0.5, 2), 3)
    cache, inputs = str(tmp_path / "cache"), _inputs(7)
    old_ort = OnnxRuntimeModel(_caller_model(tmp_path / "code", factor), NAMES, cache_dir=cache, optimize=False)
    manifest = json.loads((Path(old_ort.path).parent / MANIFEST).read_text())
    assert str((tmp_path / "code" / "graph_helpers.py").resolve()) in manifest["sources"]
    new = _caller_model(tmp_path / "code", factor + 1.5)  # the same files, the helper's constant changed
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        new_ort = OnnxRuntimeModel(new, NAMES, cache_dir=cache, optimize=False)
    assert new_ort.path == old_ort.path  # the same key: only the recorded sources tell the code changed
    torch.testing.assert_close(new_ort(**inputs)["logits"], _eager(new, inputs), atol=1e-4, rtol=0)
    said = [m for m in _ours(caplog.records) if "graph_helpers.py, whose code ran when it was built" in m]
    assert len(said) == 1 and DAMAGED in said[0], _ours(caplog.records)
    reliability.cache_verified()


WORKER = """
import os, sys, time, torch, transformers
from optimum_ipu.runtime.inference.onnx import OnnxRuntimeModel
cache, rank, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(seed)
config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=37)
model = transformers.BertForSequenceClassification(config).eval()
open(os.path.join(cache, "ready-" + rank), "w").close()
deadline = time.time() + 60
while len([n for n in os.listdir(cache) if n.startswith("ready-")]) < 2 and time.time() < deadline:
    time.sleep(0.01)
ort = OnnxRuntimeModel(model, ["input_ids", "attention_mask"], cache_dir=cache)
ids = torch.randint(3, 99, (2, 7))
inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
with torch.no_grad():
    expected = model(**inputs).logits
torch.testing.assert_close(ort(**inputs)["logits"], expected, atol=1e-4, rtol=0)
print("PATH", ort.path)
"""


def test_two_processes_building_one_entry_at_once_both_succeed(tmp_path, reliability):
    cache = tmp_path / "cache"
    (cache / "onnx" / ".tmp-deadbeef-1-killed").mkdir(parents=True)  # a writer killed mid-build, long ago
    os.utime(cache / "onnx" / ".tmp-deadbeef-1-killed", (0, 0))
    seed = random.randrange(1000)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [{"argv": ["-c", WORKER, str(cache), str(r), str(seed)], "cwd": str(tmp_path), "env": env} for r in (0, 1)]
    codes, outs, errs = zygote().run(procs, timeout=300, group=False)
    reliability.fault_injected()
    assert codes == [0, 0], "\n".join(errs)[-3000:]
    paths = {line.split()[1] for out in outs for line in out.splitlines() if line.startswith("PATH")}
    assert len(paths) == 1, outs
    folder = Path(paths.pop()).parent
    assert entry_problem(str(folder)) is None
    # one entry, no writer's temporary folder or file left behind (a killed writer's old one swept)
    assert sorted(p.name for p in (cache / "onnx").iterdir()) == [folder.name]
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, "model.onnx"]
    reliability.fault_survived()
    reliability.cache_verified()


def _truncate(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(0, len(data))])


def _corrupt(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    for at in rng.sample(range(len(data)), k=rng.randint(1, 8)):
        data[at] ^= rng.randint(1, 255)
    path.write_bytes(bytes(data))


def _served(backend: str, model: torch.nn.Module, cache: str) -> InferenceRunner:
    config = IPUConfig(executable_cache_dir=cache)
    pipelined = to_pipelined(model, config).eval()
    return InferenceRunner(pipelined, config, backend=backend, max_seq_length=32, input_names=NAMES)


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
@pytest.mark.parametrize("damage", [_truncate, _corrupt], ids=["truncated", "corrupted"])
def test_a_damaged_entry_is_rebuilt_with_one_warning(tmp_path, reliability, caplog, backend, damage):
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config()).eval()
    cache = str(tmp_path / "cache")
    first = _served(backend, model, cache)
    assert first.backend == "onnxruntime"
    path = Path(first.onnx.path)
    good = path.read_bytes()
    damage(path, random.Random(f"{backend}-{damage.__name__}"))
    reliability.fault_injected()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        again = _served(backend, model, cache)
    said = _ours(caplog.records)
    assert again.backend == "onnxruntime", said  # not a silent fall back to eager
    assert len(said) == 1 and DAMAGED in said[0] and path.parent.name in said[0], said
    assert entry_problem(str(path.parent)) is None and len(path.read_bytes()) == len(good)
    inputs = _inputs(3)
    torch.testing.assert_close(again.onnx(**inputs)["logits"], _eager(model, inputs), atol=1e-4, rtol=0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        _served(backend, model, cache)  # whole again: read without a word
    assert not _ours(caplog.records)
    reliability.fault_survived()
    reliability.cache_verified()


def test_a_manifest_that_lies_is_caught_when_the_graph_does_not_load(tmp_path, reliability, caplog):
    """A file replaced together with its manifest (a manifest recorded for garbage) still fails to load: the entry
    is moved aside and built again, with one warning."""
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config()).eval()
    first = OnnxRuntimeModel(model, NAMES, cache_dir=str(tmp_path), optimize=False)
    path = Path(first.path)
    path.write_bytes(os.urandom(256))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (path.parent / MANIFEST).write_text(json.dumps({"file": "model.onnx", "size": 256, "sha256": digest}))
    reliability.fault_injected()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        again = OnnxRuntimeModel(model, NAMES, cache_dir=str(tmp_path), optimize=False)
    said = _ours(caplog.records)
    assert len(said) == 1 and "does not load" in said[0], said
    inputs = _inputs(5)
    torch.testing.assert_close(again(**inputs)["logits"], _eager(model, inputs), atol=1e-4, rtol=0)
    reliability.fault_survived()
    reliability.cache_verified()
