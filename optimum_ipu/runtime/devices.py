"""What devices this process can use."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from accelerate.utils import is_mps_available, is_xpu_available

from .distributed import world_size


@dataclass(frozen=True)
class DeviceInfo:
    """The accelerator kind of this machine and how many of them there are.

    Args:
        kind (`str`): `"cuda"`, `"xpu"`, `"mps"` or `"cpu"`.
        count (`int`): devices of that kind (1 for the CPU).
        names (`list[str]`): a human-readable name per device.
        world_size (`int`): processes of this job (`WORLD_SIZE` set by `torchrun`, else 1).
    """

    kind: str
    count: int
    names: list[str]
    world_size: int


def _accelerator_kind() -> str:
    """The accelerator of this machine, found as `accelerate` finds it (`PartialState.default_device`), without
    creating accelerate's state (which would start the process group before ours, with its timeout)."""
    if torch.cuda.is_available():
        return "cuda"
    if is_xpu_available():
        return "xpu"
    if is_mps_available():
        return "mps"
    return "cpu"


def detect_devices() -> DeviceInfo:
    processes = world_size()
    kind = _accelerator_kind()
    if kind == "cuda":
        n = torch.cuda.device_count()
        return DeviceInfo("cuda", n, [torch.cuda.get_device_name(i) for i in range(n)], processes)
    if kind == "xpu":
        n = torch.xpu.device_count()
        return DeviceInfo("xpu", n, [torch.xpu.get_device_name(i) for i in range(n)], processes)
    if kind == "mps":
        return DeviceInfo("mps", 1, ["Apple GPU (MPS)"], processes)
    return DeviceInfo("cpu", 1, [f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"], processes)


def default_device() -> torch.device:
    """The device of this process: its local GPU (CUDA or XPU) under torchrun, GPU 0, Apple's MPS, or the CPU."""
    kind = _accelerator_kind()
    if kind in ("cuda", "xpu"):
        return torch.device(kind, int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(kind)


def check_device(device: torch.device, name: str = "device") -> torch.device:
    """`device` if this machine has it; otherwise a `ValueError` naming what there is (`cuda:7` on a machine with
    two GPUs, or with none: torch said only "Torch not compiled with CUDA enabled" or "invalid device ordinal")."""
    if device.type in ("cuda", "xpu"):
        module = getattr(torch, device.type)
        count = module.device_count() if module.is_available() else 0
        if device.index is not None and device.index >= count or count == 0:
            there = (
                f"{count} {device.type.upper()} device(s) ({device.type}:0 to {device.type}:{count - 1})"
                if count
                else f"no {device.type.upper()} device"
            )
            raise ValueError(f'{name}: got {str(device)!r}; this machine has {there}: pass one of those, or "cpu"')
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{name}: got 'mps'; this machine has no Apple GPU: pass \"cpu\"")
    return device


def supports_bf16() -> bool:
    """Whether this process's CUDA device computes bf16 natively."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def cpu_supports_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX), so that bf16 autocast is faster
    than fp32 on it rather than slower (emulated)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)
