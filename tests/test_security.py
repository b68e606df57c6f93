"""A static scan of the library, the example scripts and the benchmarks (with `ast`, so comments and strings do not
count): weights are read with safetensors or `torch.load(weights_only=True)` only, no `trust_remote_code=True`
unless a user passes it, and configs are JSON (no pickle, YAML, marshal or `eval`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from .conftest import REPO_ROOT

SCANNED = ("optimum_ipu", "examples", "benchmarks")
# Modules that turn bytes into objects (code included): a config or a checkpoint must never go through them.
UNSAFE_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "cloudpickle",
    "joblib",
    "marshal",
    "shelve",
    "yaml",
    "ruamel",
    "jsonpickle",
}


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def violations(source: str, filename: str = "<source>") -> Iterator[str]:
    """Every unsafe construct of `source`, as `file:line: what`."""
    tree = ast.parse(source, filename)
    # names bound to torch.load / numpy.load by `from torch import load [as x]`
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("torch", "numpy"):
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in UNSAFE_MODULES:
                    yield f"{where}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            yield f"{where}: from {node.module} import ..."
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            name = aliases.get(name, name)
            if name == "torch.load" and not _is_true(_keyword(node, "weights_only")):
                yield f"{where}: torch.load without weights_only=True"
            if name in ("numpy.load", "np.load") and _is_true(_keyword(node, "allow_pickle")):
                yield f"{where}: numpy.load(allow_pickle=True)"
            if name in ("eval", "exec", "builtins.eval", "builtins.exec"):
                yield f"{where}: {name}()"
            if _is_true(_keyword(node, "trust_remote_code")):
                yield f"{where}: trust_remote_code=True"
        elif isinstance(node, ast.Dict):  # keyword arguments gathered in a dict: {"trust_remote_code": True}
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "trust_remote_code" and _is_true(value):
                    yield f"{where}: trust_remote_code=True"
        elif isinstance(node, ast.AnnAssign) and _dotted(node.target) == "trust_remote_code":
            value = node.value
            default = _keyword(value, "default") if isinstance(value, ast.Call) else value
            if _is_true(default):
                yield f"{where}: trust_remote_code defaults to True"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            if any(a.arg == "trust_remote_code" and _is_true(d) for a, d in pairs):
                yield f"{where}: {node.name}(trust_remote_code=True) by default"


def python_files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (REPO_ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_scan_finds_what_it_looks_for():
    bad = """
import pickle
from yaml import safe_load
from torch import load as tload
import torch, numpy as np
from dataclasses import field
torch.load("w.pt")
torch.load("w.pt", weights_only=False)
tload("w.pt")
np.load("a.npy", allow_pickle=True)
eval("1")
AutoModel.from_pretrained("m", trust_remote_code=True)
class Args:
    trust_remote_code: bool = field(default=True)
def load(path, trust_remote_code=True): ...
"""
    found = list(violations(bad))
    assert len(found) == 10, found
    good = (
        'import json, torch\ntorch.load("w.pt", weights_only=True)\nx = field(default=False)\ntrust_remote_code=False'
    )
    assert list(violations(good)) == []


def test_no_unsafe_loading_in_the_library_examples_and_benchmarks():
    files = python_files()
    assert len(files) > 40 and any(p.name == "run_qa.py" for p in files), "the scan must see the code"
    found = [
        v for path in files for v in violations(path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT)))
    ]
    assert found == [], "\n".join(found)


def test_examples_trust_remote_code_only_when_asked():
    """Where an example passes `trust_remote_code` on, the value is the user's `--trust_remote_code` (a dataclass
    argument defaulting to False), never a literal."""
    checked = 0
    for path in sorted((REPO_ROOT / "examples").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if "trust_remote_code" not in source:
            continue
        tree = ast.parse(source)
        fields = [
            n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and _dotted(n.target) == "trust_remote_code"
        ]
        assert all(not _is_true(_keyword(f.value, "default")) for f in fields), path.name  # declared: False
        passed = [
            k.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            for k in n.keywords
            if k.arg == "trust_remote_code"
        ]
        passed += [
            v
            for n in ast.walk(tree)
            if isinstance(n, ast.Dict)
            for k, v in zip(n.keys, n.values, strict=True)
            if isinstance(k, ast.Constant) and k.value == "trust_remote_code"
        ]
        # a script may declare the flag and hand it to example_utils, which passes it on (checked there)
        assert all(_dotted(v).endswith(".trust_remote_code") for v in passed), path.name
        checked += bool(passed)
    assert checked >= 4  # the speech scripts and example_utils (which the others hand the flag to)
