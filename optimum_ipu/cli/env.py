"""`optimum-ipu env`: the versions and the machine, in `transformers env`'s copy-and-paste format for an issue."""

from __future__ import annotations

import os
import platform
from importlib import metadata

# The distributions whose versions decide how a run behaves, in the order a bug report wants them.
PACKAGES = (
    "optimum-ipu",
    "transformers",
    "torch",
    "accelerate",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
    "datasets",
    "onnxruntime",
    "onnx",
)


def package_version(name: str) -> str:
    """The installed version of a distribution, or `"not installed"`."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (a container or taskset limits it)
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def environment_info() -> dict[str, str]:
    """
    The facts of `optimum-ipu env`, as `{label: value}`: every relevant package version, the platform, Python,
    PyTorch's accelerator support, the GPUs seen and the CPUs usable by this process.

    Returns:
        `dict[str, str]`: labels in the order they are printed.
    """
    import torch

    info = {f"`{name}` version": package_version(name) for name in PACKAGES}
    info["`torch` version"] = torch.__version__  # the running one, with its local tag (+cpu, +cu128)
    info["Platform"] = platform.platform()
    info["Python version"] = platform.python_version()
    info["CUDA version (torch build)"] = torch.version.cuda or "none (CPU build)"
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["GPU type"] = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
    else:
        mps = getattr(torch.backends, "mps", None)
        info["GPU type"] = "none (Apple MPS available)" if mps is not None and mps.is_available() else "none"
    info["CPUs usable"] = f"{_usable_cpus()} (of {os.cpu_count()} on the machine)"
    info["Hub offline (HF_HUB_OFFLINE)"] = os.environ.get("HF_HUB_OFFLINE", "not set")
    return info


def format_environment(info: dict[str, str]) -> str:
    """The facts as `transformers env` prints them: a header line, then `- label: value` lines."""
    lines = ["Copy-and-paste the text below in your GitHub issue and FILL OUT the two last points.", ""]
    lines += [f"- {label}: {value}" for label, value in info.items()]
    lines += ["- Using distributed or parallel set-up in script?: <fill in>", "- Using GPU in script?: <fill in>"]
    return "\n".join(lines)
