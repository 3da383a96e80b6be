"""A small model trains on flagos exactly as it does on the CPU."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import torch_fl  # noqa: F401  (registers "flagos")

STEPS = 20
TOLERANCE = 1e-5


@dataclass
class Run:
    losses: list[float]
    model: nn.Module


def make_model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)
    )


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(128, 16, generator=gen)
    y = torch.randint(0, 4, (128,), generator=gen)
    return x, y


def train(model: nn.Module, device: str) -> Run:
    model = model.to(device)
    x, y = (t.to(device) for t in make_data())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return Run(losses, model)


def prefixed(name: str) -> Callable[[str], str]:
    return lambda message: f"{name}: {message}"


@pytest.fixture(scope="module")
def runs() -> tuple[Run, Run]:
    initial = make_model()
    on_cpu = train(copy.deepcopy(initial), "cpu")
    on_flagos = train(copy.deepcopy(initial), "flagos")
    return on_flagos, on_cpu


def test_model_parameters_live_on_flagos(runs: tuple[Run, Run]) -> None:
    on_flagos, _ = runs
    assert all(p.device == torch.device("flagos", 0) for p in on_flagos.model.parameters())


def test_losses_match_cpu_at_every_step(runs: tuple[Run, Run]) -> None:
    on_flagos, on_cpu = runs
    diffs = [abs(a - b) for a, b in zip(on_flagos.losses, on_cpu.losses)]
    assert len(on_flagos.losses) == STEPS
    assert max(diffs) <= TOLERANCE, list(zip(on_flagos.losses, on_cpu.losses))


def test_loss_decreases(runs: tuple[Run, Run]) -> None:
    on_flagos, _ = runs
    assert on_flagos.losses[-1] < on_flagos.losses[0]


def test_final_weights_match_cpu(runs: tuple[Run, Run]) -> None:
    on_flagos, on_cpu = runs
    for (name, p_fl), (_, p_cpu) in zip(
        on_flagos.model.named_parameters(), on_cpu.model.named_parameters()
    ):
        torch.testing.assert_close(
            p_fl.detach().cpu(), p_cpu.detach(), rtol=0, atol=TOLERANCE, msg=prefixed(name)
        )


def test_gradients_match_cpu(runs: tuple[Run, Run]) -> None:
    on_flagos, on_cpu = runs
    for (name, p_fl), (_, p_cpu) in zip(
        on_flagos.model.named_parameters(), on_cpu.model.named_parameters()
    ):
        assert p_fl.grad is not None and p_fl.grad.device.type == "flagos"
        torch.testing.assert_close(
            p_fl.grad.cpu(), p_cpu.grad, rtol=0, atol=TOLERANCE, msg=prefixed(name)
        )
