"""The public APIs over the ops whose arguments flagosd checks against each
other before their kernel runs (daemon/ops/op_argument_rules.h) still mean what
they mean on the CPU: cummax/cummin (aten::_cummax_helper, _cummin_helper),
batch norm (native_batch_norm and its relatives, running statistics
included), the fused optimizers (_fused_adam_, _fused_adamw_, _fused_sgd_,
_fused_adagrad_), rrelu in training (rrelu_with_noise) and the fused
observer fake-quantisation (fused_moving_avg_obs_fake_quant).

Each test runs the same computation on CPU tensors (the reference) and on
flagos copies, and compares.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_fl  # noqa: F401  (registers "flagos")

FL = torch.device("flagos", 0)


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cummax_and_cummin_match_the_cpu(op, dim: int) -> None:
    x = rand(4, 6, 3)
    x[1, 2] = x[0, 2]  # ties: the index of the last one wins
    values, indices = op(x.to(FL), dim)
    expected_values, expected_indices = op(x, dim)
    torch.testing.assert_close(values.cpu(), expected_values, rtol=0, atol=0)
    torch.testing.assert_close(indices.cpu(), expected_indices, rtol=0, atol=0)


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
def test_cummax_and_cummin_of_a_transposed_input_and_into_out(op) -> None:
    x = rand(5, 7).t()
    values = torch.empty(7, 5, device=FL)
    indices = torch.empty(7, 5, dtype=torch.long, device=FL)
    op(x.to(FL), 1, out=(values, indices))
    expected_values, expected_indices = op(x, 1)
    torch.testing.assert_close(values.cpu(), expected_values, rtol=0, atol=0)
    torch.testing.assert_close(indices.cpu(), expected_indices, rtol=0, atol=0)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_and_its_running_statistics_match_the_cpu(training: bool) -> None:
    x = rand(4, 3, 5, 5)
    weight, bias = rand(3, seed=1), rand(3, seed=2)
    mean, var = rand(3, seed=3), rand(3, seed=4).abs() + 0.5
    fl_mean, fl_var = mean.to(FL), var.to(FL)
    out = F.batch_norm(x.to(FL), fl_mean, fl_var, weight.to(FL), bias.to(FL), training, 0.1, 1e-5)
    expected = F.batch_norm(x, mean, var, weight, bias, training, 0.1, 1e-5)
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(fl_mean.cpu(), mean)
    torch.testing.assert_close(fl_var.cpu(), var)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("track", [True, False], ids=["running-stats", "no-running-stats"])
@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 6)])
def test_batch_norm_backward_matches_the_cpu(train: bool, track: bool, shape) -> None:
    x = rand(*shape)
    module = torch.nn.BatchNorm1d(3, track_running_stats=track).train(train)
    fl_module = torch.nn.BatchNorm1d(3, track_running_stats=track).to(FL).train(train)
    fl_x = x.to(FL).requires_grad_()
    x.requires_grad_()
    module(x).square().sum().backward()
    fl_module(fl_x).square().sum().backward()
    torch.testing.assert_close(fl_x.grad.cpu(), x.grad)
    torch.testing.assert_close(fl_module.weight.grad.cpu(), module.weight.grad)
    if track:
        torch.testing.assert_close(fl_module.running_mean.cpu(), module.running_mean)
        torch.testing.assert_close(fl_module.running_var.cpu(), module.running_var)


def test_channels_last_batch_norm_matches_the_cpu() -> None:
    x = rand(2, 3, 4, 5).to(memory_format=torch.channels_last)
    module = torch.nn.BatchNorm2d(3)
    fl_module = torch.nn.BatchNorm2d(3).to(FL)
    torch.testing.assert_close(fl_module(x.to(FL)).cpu(), module(x))
    torch.testing.assert_close(fl_module.running_var.cpu(), module.running_var)


@pytest.mark.parametrize(
    "make",
    [
        lambda params: torch.optim.Adam(params, lr=0.01, fused=True),
        lambda params: torch.optim.Adam(params, lr=0.01, amsgrad=True, fused=True),
        lambda params: torch.optim.AdamW(params, lr=0.01, fused=True),
        lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=True),
        lambda params: torch.optim.SGD(params, lr=0.01, fused=True),
        lambda params: torch.optim.Adagrad(params, lr=0.01, fused=True),
    ],
    ids=["adam", "adam-amsgrad", "adamw", "sgd-momentum", "sgd", "adagrad"],
)
def test_fused_optimizers_step_as_on_the_cpu(make) -> None:
    cpu_params = [rand(4, 3, seed=5).requires_grad_(), rand(7, seed=6).requires_grad_()]
    fl_params = [p.detach().to(FL).requires_grad_() for p in cpu_params]
    cpu_opt, fl_opt = make(cpu_params), make(fl_params)
    for step in range(3):
        for cpu_p, fl_p in zip(cpu_params, fl_params):
            grad = rand(*cpu_p.shape, seed=10 + step)
            cpu_p.grad, fl_p.grad = grad, grad.to(FL)
        cpu_opt.step()
        fl_opt.step()
    for cpu_p, fl_p in zip(cpu_params, fl_params):
        torch.testing.assert_close(fl_p.detach().cpu(), cpu_p.detach())


def test_rrelu_in_training_scales_each_negative_by_a_slope_in_range() -> None:
    # Random slopes: checked against their definition, not CPU torch's draw.
    x = rand(64)
    lower, upper = 0.1, 0.3
    y = F.rrelu(x.to(FL), lower, upper, training=True).cpu()
    positive = x >= 0
    torch.testing.assert_close(y[positive], x[positive], rtol=0, atol=0)
    slopes = y[~positive] / x[~positive]
    assert bool(((slopes >= lower - 1e-6) & (slopes <= upper + 1e-6)).all()), slopes


@pytest.mark.parametrize("per_channel", [False, True])
def test_fused_fake_quantize_observer_matches_the_cpu(per_channel: bool) -> None:
    from torch.ao.quantization import FusedMovingAvgObsFakeQuantize, MovingAverageMinMaxObserver
    from torch.ao.quantization import MovingAveragePerChannelMinMaxObserver

    if per_channel:
        make = lambda: FusedMovingAvgObsFakeQuantize(  # noqa: E731
            observer=MovingAveragePerChannelMinMaxObserver, ch_axis=0, dtype=torch.qint8,
            qscheme=torch.per_channel_symmetric, quant_min=-128, quant_max=127)
    else:
        make = FusedMovingAvgObsFakeQuantize
    cpu_fq, fl_fq = make(), make()
    if per_channel:
        # A per-channel observer starts with empty statistics, which its
        # kernel resizes in place: a resize flagosd cannot make of device
        # memory (docs/reference/errors.md). Its first step runs on the CPU.
        first = rand(4, 8, seed=19)
        cpu_fq(first)
        fl_fq(first)
    fl_fq = fl_fq.to(FL)
    for step in range(2):
        x = rand(4, 8, seed=20 + step)
        torch.testing.assert_close(fl_fq(x.to(FL)).cpu(), cpu_fq(x))
    torch.testing.assert_close(fl_fq.scale.cpu(), cpu_fq.scale)
    torch.testing.assert_close(fl_fq.zero_point.cpu(), cpu_fq.zero_point)
