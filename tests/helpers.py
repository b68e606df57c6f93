"""Helpers shared by the test modules (a test module imports from here, never from another test module)."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import os
import subprocess
import sys
from types import ModuleType

import datasets
import torch
import transformers

from optimum_ipu import IPUTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.runtime.devices import cpu_supports_bf16

from .conftest import PYTHON, REPO_ROOT
from .processes import free_port, run_python, run_torchrun  # noqa: F401  (free_port: the tests' import site)
from .tiny_models import VOCAB, tiny_config, tiny_inputs

# ------------------------------------------------------------------ processes (torchrun, scripts)
TORCHRUN = [PYTHON, "-m", "torch.distributed.run"]


def env(**extra: str) -> dict[str, str]:
    # HF_DATASETS_OFFLINE too: the suite is offline, and one environment lets the test zygote serve every process
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **offline, "OMP_NUM_THREADS": "1", **extra}


def half_precision_flags() -> list[str]:
    """`--bf16` where this CPU multiplies bf16 natively (AVX512-BF16 or AMX), else none (fp32): emulated, a Whisper
    tiny step takes about a minute, and the suite's machines are of both kinds."""
    return ["--bf16"] if cpu_supports_bf16() else []


def launch(
    *args: str, extra_env: dict | None = None, timeout: int = 300, real: bool = False
) -> subprocess.CompletedProcess:
    """`args` run from the repository root: `python ...` and `torchrun` jobs start from the test zygote
    (`tests/processes.py`: same meaning, no import time), anything else, or with `real=True` (a test of torchrun's
    own behaviour), as a subprocess."""
    command, environment = list(args), env(**(extra_env or {}))
    if real:
        return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=timeout, cwd=REPO_ROOT)
    if command[: len(TORCHRUN)] == TORCHRUN:
        return run_torchrun(command[len(TORCHRUN) :], cwd=REPO_ROOT, env=environment, timeout=timeout)
    if command[0] == PYTHON:
        return run_python(command[1:], cwd=REPO_ROOT, env=environment, timeout=timeout)
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=timeout, cwd=REPO_ROOT)


def run_example(folder, script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """An example script run in its own folder (it reads `./ipu_config.json` there), offline, with one intra-op
    thread: tiny models gain nothing from two, and spin-waiting threads crawl on a shared CPU."""
    return run_python([script, *args], cwd=folder, env=env(HF_DATASETS_OFFLINE="1"), timeout=timeout)


def run_flags(output_dir, *, seed: int = 0) -> tuple[str, ...]:
    """The flags every example-script test ends with: a loss logged each step, no checkpoint, a fixed seed, its own
    output folder, no reporting and no progress bars."""
    return (
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--seed",
        str(seed),
        "--output_dir",
        str(output_dir),
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
    )


def _take(row: dict) -> int:
    return int(row["file_name"].rsplit("_", 1)[1].split(".")[0])  # 7_lucas_12.wav: take 12


def fsdd_subset(fsdd_split, folder, per_digit: int, skip: int = 0):
    """An `audiofolder` at `folder` of `per_digit` recordings of each digit of an FSDD split (linked, not copied), the
    speakers in turn, after the first `skip` of each digit: a small set that says every digit (a split's first rows
    are all "zero")."""
    rows = list(csv.DictReader((fsdd_split / "metadata.csv").open()))
    folder.mkdir(parents=True)
    picked = []
    for digit in range(10):
        takes = sorted((r for r in rows if r["label"] == str(digit)), key=lambda r: (_take(r), r["speaker"]))
        picked += takes[skip : skip + per_digit]
    with (folder / "metadata.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in picked:
            (folder / row["file_name"]).symlink_to(fsdd_split / row["file_name"])
            writer.writerow(row)
    return folder


# ------------------------------------------------------------------ packing: features of known lengths
LENGTHS = [9, 14, 5, 20, 7, 11, 16, 3, 12]  # 97 tokens: 4 rows of 32 at best
MAX_LEN = 32


def packing_features(seed: int = 0) -> dict[str, list]:
    g = torch.Generator().manual_seed(seed)
    features: dict[str, list] = {k: [] for k in ("input_ids", "token_type_ids", "start_positions", "end_positions")}
    features["labels"] = []
    for n in LENGTHS:
        features["input_ids"].append(torch.randint(2, VOCAB, (n,), generator=g).tolist())
        features["token_type_ids"].append([0] * (n // 2) + [1] * (n - n // 2))  # question, then context
        start, end = sorted(torch.randint(0, n, (2,), generator=g).tolist())
        features["start_positions"].append(start)
        features["end_positions"].append(end)
        features["labels"].append(int(torch.randint(0, 3, (1,), generator=g)))
    return features


def packed_rows(packed: dict[str, list]) -> list[dict]:
    return [{k: v[r] for k, v in packed.items()} for r in range(len(packed["input_ids"]))]


def feature_alone(features: dict[str, list], i: int) -> dict[str, torch.Tensor]:
    return {k: torch.tensor([features[k][i]]) for k in ("input_ids", "token_type_ids")}


def take_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def assert_same_grads(packed: dict[str, torch.Tensor], alone: dict[str, torch.Tensor]) -> None:
    assert packed.keys() == alone.keys() and len(packed) > 10
    for name, grad in packed.items():
        torch.testing.assert_close(grad, alone[name], atol=1e-5, rtol=1e-4, msg=name)


# ------------------------------------------------------------------ generation: a model whose tokens vary
PAD, EOS = 0, VOCAB - 1


def generating_model(class_name: str) -> transformers.PreTrainedModel:
    """A tiny random model whose outputs vary from step to step (default init gives one repeated token)."""
    family = "t5" if class_name.startswith("T5") else "gpt2"
    config = tiny_config(family)
    if family == "t5":
        config.initializer_factor = 8.0
        config.eos_token_id = EOS
    else:
        config.initializer_range = 0.5
        config.bos_token_id = config.eos_token_id = EOS
    config.pad_token_id = PAD
    torch.manual_seed(0)
    return getattr(transformers, class_name)(config).eval()


# ------------------------------------------------------------------ IPUTrainer on a tiny classifier
TRAINER_CLASS = "BertForSequenceClassification"


def classification_dataset(rows: int, seed: int = 0) -> datasets.Dataset:
    """`rows` random examples of the tiny `TRAINER_CLASS` model, with labels."""
    data = tiny_inputs(TRAINER_CLASS, batch=rows, seed=seed)
    return datasets.Dataset.from_dict({k: v.tolist() for k, v in data.items()})


# quiet, deterministic training arguments of a short run (for IPUTrainingArguments and transformers' alike)
SHORT_RUN = {
    "learning_rate": 1e-3,
    "logging_steps": 1,
    "report_to": [],
    "seed": 7,
    "save_strategy": "no",
    "disable_tqdm": True,
}


def training_arguments(out, **kwargs) -> IPUTrainingArguments:
    """`SHORT_RUN` arguments, micro-batch 2, one epoch, into `out` (`kwargs` override)."""
    defaults = {"per_device_train_batch_size": 2, "num_train_epochs": 1, **SHORT_RUN}
    return IPUTrainingArguments(output_dir=str(out), **{**defaults, **kwargs})


def saved_weights(folder) -> dict:
    """The weights of a saved model folder: one `model.safetensors`, or the shards its index names (a model whose
    stages ran on separate processes is saved by each stage)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return load_file(folder / "model.safetensors")
    files = set(json.loads(index.read_text())["weight_map"].values())
    return {key: value for name in sorted(files) for key, value in load_file(folder / name).items()}


def load_script(folder, name: str, prefix: str = "script") -> ModuleType:
    """An example script as a module (its folder on the path, for its helper modules), registered in `sys.modules`
    under `{prefix}_{name}`: its dataclasses resolve their string annotations through it."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"{prefix}_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_main(module: ModuleType, argv: list[str]) -> tuple[int, str]:
    """`run_script(module.main)` with `argv`, in this process: the exit code and stderr."""
    import pytest

    err, saved = io.StringIO(), sys.argv
    sys.argv = [f"{module.__name__}.py", *argv]
    try:
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
            run_script(module.main)
    finally:
        sys.argv = saved
    return exit_.value.code, err.getvalue()


def one_clear_line(reliability, code: int, stderr: str, names: tuple[str, ...]) -> None:
    """Exit code 2; the last line of stderr is the error, naming every one of `names`; no traceback."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    clear = code == 2 and "Traceback" not in stderr and all(n in last for n in names) and len(last) < 700
    assert reliability.bad_input(clear), (code, stderr[-2000:])
