"""LAMB against the formulas of the paper, step by step."""

from __future__ import annotations

import math

import torch

from optimum_ipu.runtime.optimizers import Lamb


def reference_lamb(w, grads, lr, betas, eps, wd, max_trust):
    """The algorithm written out with Python floats, one element at a time."""
    m = [0.0] * len(w)
    v = [0.0] * len(w)
    for t, g in enumerate(grads, start=1):
        m = [betas[0] * mi + (1 - betas[0]) * gi for mi, gi in zip(m, g, strict=True)]
        v = [betas[1] * vi + (1 - betas[1]) * gi * gi for vi, gi in zip(v, g, strict=True)]
        m_hat = [mi / (1 - betas[0] ** t) for mi in m]
        v_hat = [vi / (1 - betas[1] ** t) for vi in v]
        update = [mh / (math.sqrt(vh) + eps) + wd * wi for mh, vh, wi in zip(m_hat, v_hat, w, strict=True)]
        w_norm, u_norm = math.sqrt(sum(x * x for x in w)), math.sqrt(sum(x * x for x in update))
        trust = min(w_norm / u_norm, max_trust) if w_norm > 0 and u_norm > 0 else 1.0
        w = [wi - lr * trust * ui for wi, ui in zip(w, update, strict=True)]
    return w


def test_lamb_matches_the_formulas():
    start = [0.5, -1.0, 2.0, 0.25]
    grads = [[0.1, -0.2, 0.3, 0.0], [0.05, 0.4, -0.1, 0.2], [-0.3, 0.1, 0.2, -0.1]]
    param = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    optimizer = Lamb([param], lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1, max_trust_ratio=10.0)
    for g in grads:
        param.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
    expected = reference_lamb(start, grads, 0.01, (0.9, 0.99), 1e-6, 0.1, 10.0)
    torch.testing.assert_close(param.detach(), torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)


def test_zero_weights_take_the_adam_step_and_none_grads_are_skipped():
    zero = torch.nn.Parameter(torch.zeros(3))
    untouched = torch.nn.Parameter(torch.ones(2))
    optimizer = Lamb([zero, untouched], lr=0.1)
    zero.grad = torch.tensor([1.0, -1.0, 0.5])
    optimizer.step()
    torch.testing.assert_close(zero.detach(), torch.tensor([-0.1, 0.1, -0.1]), atol=1e-5, rtol=0)
    assert torch.equal(untouched.detach(), torch.ones(2)) and untouched not in optimizer.state


def test_host_offloaded_optimizer_gives_the_plain_optimizer_numbers_and_checkpoints():
    """`optimizer_state_offchip`: same weights as the plain optimizer under an LR schedule; state_dict round trip."""
    from optimum_ipu.runtime.offload import HostOffloadedOptimizer

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    plain, offloaded = model(), model()
    groups = [
        {"params": list(offloaded[0].parameters()), "weight_decay": 0.1},
        {"params": list(offloaded[2].parameters()), "weight_decay": 0.0},
    ]
    plain_opt = torch.optim.AdamW(
        [
            {"params": list(plain[0].parameters()), "weight_decay": 0.1},
            {"params": list(plain[2].parameters()), "weight_decay": 0.0},
        ],
        lr=1e-2,
    )
    host_opt = HostOffloadedOptimizer(groups, torch.optim.AdamW, lr=1e-2)
    schedules = [torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.1, 5) for o in (plain_opt, host_opt)]
    offloaded[2].bias.requires_grad_(False)  # a frozen parameter stays as it is
    plain[2].bias.requires_grad_(False)
    for step in range(4):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step))
        for net, optimizer, schedule in zip((plain, offloaded), (plain_opt, host_opt), schedules, strict=True):
            net(x).pow(2).sum().backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    for a, b in zip(plain.parameters(), offloaded.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert all(t.device.type == "cpu" for s in host_opt.state.values() for t in s.values() if torch.is_tensor(t))
    regrouped = [{"params": list(offloaded[0].parameters())}, {"params": list(offloaded[2].parameters())}]
    restored = HostOffloadedOptimizer(regrouped, torch.optim.AdamW, lr=1e-2)
    restored.load_state_dict(host_opt.state_dict())
    assert restored.param_groups[0]["lr"] == host_opt.param_groups[0]["lr"] == plain_opt.param_groups[0]["lr"]
    torch.testing.assert_close(
        restored.state_dict()["state"][0]["exp_avg"], plain_opt.state_dict()["state"][0]["exp_avg"]
    )
