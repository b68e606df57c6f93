"""Device detection: the accelerators `accelerate` knows (CUDA, XPU, Apple's MPS), else the CPU."""

from __future__ import annotations

import torch

from optimum_ipu.runtime import devices


def test_the_cpu_when_no_accelerator_is_present():
    assert devices.default_device() == torch.device("cpu")  # this machine: no GPU
    assert devices.detect_devices().kind == "cpu"


def test_an_apple_gpu_is_used_not_silently_the_cpu(monkeypatch):
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "is_xpu_available", lambda: False)
    monkeypatch.setattr(devices, "is_mps_available", lambda: True)
    assert devices.default_device() == torch.device("mps")
    assert devices.detect_devices().kind == "mps"


def test_an_xpu_under_torchrun_is_the_local_ranks(monkeypatch):
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "is_xpu_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert devices.default_device() == torch.device("xpu", 3)
