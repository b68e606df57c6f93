"""What devices this process can use."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .distributed import world_size


@dataclass(frozen=True)
class DeviceInfo:
    """The accelerator kind of this machine and how many of them there are.

    Args:
        kind (`str`): `"cuda"` or `"cpu"`.
        count (`int`): devices of that kind (1 for the CPU).
        names (`list[str]`): a human-readable name per device.
        world_size (`int`): processes of this job (`WORLD_SIZE` set by `torchrun`, else 1).
    """

    kind: str
    count: int
    names: list[str]
    world_size: int


def detect_devices() -> DeviceInfo:
    processes = world_size()
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return DeviceInfo("cuda", n, [torch.cuda.get_device_name(i) for i in range(n)], processes)
    return DeviceInfo("cpu", 1, [f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"], processes)


def default_device() -> torch.device:
    """The device of this process: its local GPU under torchrun, GPU 0, or the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def supports_bf16() -> bool:
    """Whether this process's CUDA device computes bf16 natively."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
