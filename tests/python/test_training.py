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


# torch_fl infers each op's outputs on meta tensors and caches that by the
# op and its arguments' metadata and values (plugin/csrc/shape_inference.h).
# Adam without capturable=True computes its bias corrections on the host,
# so its _foreach_div_ and _foreach_addcdiv_ get new float scalars each
# step, and so does every op a learning-rate scheduler feeds; keyed by value,
# each of those calls ran its meta kernel again, every step (2-3 ms of a
# 0.7 ms step). Float values of pointwise and _foreach_ ops are keyed by
# kind: after the first steps, a step infers nothing on meta.
def test_per_step_scalars_of_adam_and_a_scheduler_reuse_inferred_shapes() -> None:
    losses: dict[str, list[float]] = {}
    models: dict[str, nn.Module] = {}
    inferred_after_warmup = 0
    for device in ("cpu", "flagos"):
        model = make_model().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
        x, y = (t.to(device) for t in make_data())
        losses[device] = []
        for step in range(8):
            if device == "flagos" and step == 3:
                before = torch_fl._C._meta_inference_count()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses[device].append(loss.item())
        if device == "flagos":
            inferred_after_warmup = torch_fl._C._meta_inference_count() - before
        models[device] = model
    assert inferred_after_warmup == 0
    # AdamW divides by the root of the squared gradients, which scales up
    # rounding where a gradient is near zero: the native route's kernels
    # (kunlunxin-xdnn pass) end up to 2e-5 from the CPU's on a bias; a
    # wrong step would be off by about the learning rate (1e-2 / (1 + step)).
    torch.testing.assert_close(losses["flagos"], losses["cpu"], rtol=1e-4, atol=1e-5)
    for a, b in zip(models["flagos"].parameters(), models["cpu"].parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-4)


# The counter above counts: a call whose float values decide its output's
# size (arange's end; no other test of the process uses these) is inferred
# again for each new value, and a float scalar's kind still decides a
# pointwise op's dtype.
def test_values_that_decide_an_outputs_metadata_are_still_inferred_apart() -> None:
    before = torch_fl._C._meta_inference_count()
    for end in (10.0123457, 11.0123457, 12.0123457):
        got = torch.arange(0.0, end, device="flagos")
        assert got.shape == torch.arange(0.0, end).shape == (int(end) + 1,)
    assert torch_fl._C._meta_inference_count() - before == 3
    ints = torch.arange(6)
    for scalar in (2, 2.5, 3, 0.5):
        for op in (torch.ops.aten.mul.Scalar, torch.ops.aten.pow.Tensor_Scalar):
            got = op(ints.to("flagos"), scalar)
            want = op(ints, scalar)
            assert got.dtype == want.dtype, (op, scalar)
            torch.testing.assert_close(got.cpu(), want)
