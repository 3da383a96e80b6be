"""A small CNN and a small transformer encoder train on flagos as on the CPU.

Each model is trained 20 steps from the same initial weights on the same
data with Adam (foreach and for-loop) and SGD with momentum, clipping the
gradient norm every step; the losses, the clipped norms and the final
parameters and buffers must match the CPU run."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from models import FL, prefixed, cnn_data, make_cnn, make_transformer, transformer_data

STEPS = 20
LOSS_RTOL = 1e-4
PARAM_RTOL = 1e-4
PARAM_ATOL = 1e-5
MAX_NORM = 0.5

# Adam's eps is 1e-5, not 1e-8: the attention's key bias has a gradient that is
# zero up to rounding (~1e-9, softmax ignores it), and with eps=1e-8 Adam
# would turn that rounding noise into full-size steps that differ between
# any two implementations.
OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, eps=1e-5, foreach=True),
    "adam_forloop": lambda p: torch.optim.Adam(p, lr=1e-2, eps=1e-5, foreach=False),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
}

Data = tuple[torch.Tensor, torch.Tensor]
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], Data]]] = {
    "cnn": (make_cnn, cnn_data),
    "transformer": (make_transformer, transformer_data),
}


@dataclass
class Run:
    losses: list[float]
    norms: list[float]
    model: nn.Module
    optimizer: torch.optim.Optimizer


def train(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], optimizer_name: str,
          device: str) -> Run:
    model = model.to(device)
    model.train()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.eval()  # deterministic: the devices' random numbers differ from the CPU's
    x, y = (t.to(device) for t in data)
    optimizer = OPTIMIZERS[optimizer_name](list(model.parameters()))
    losses, norms = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return Run(losses, norms, model, optimizer)


@pytest.fixture(
    scope="module",
    params=[(m, o) for m in MODELS for o in OPTIMIZERS],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def runs(request: pytest.FixtureRequest) -> tuple[Run, Run]:
    model_name, optimizer_name = request.param
    make_model, make_data = MODELS[model_name]
    initial = make_model()
    data = make_data()
    on_cpu = train(copy.deepcopy(initial), data, optimizer_name, "cpu")
    on_flagos = train(copy.deepcopy(initial), data, optimizer_name, FL)
    return on_flagos, on_cpu


def test_parameters_and_state_live_on_flagos(runs: tuple[Run, Run]) -> None:
    on_flagos, _ = runs
    for name, t in list(on_flagos.model.named_parameters()) + list(on_flagos.model.named_buffers()):
        assert t.device.type == FL, name
    for state in on_flagos.optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                assert value.device.type == FL, key


def test_losses_match_cpu_at_every_step(runs: tuple[Run, Run]) -> None:
    on_flagos, on_cpu = runs
    assert len(on_flagos.losses) == STEPS
    bad = [
        (i, a, b) for i, (a, b) in enumerate(zip(on_flagos.losses, on_cpu.losses))
        if abs(a - b) > LOSS_RTOL * abs(b)
    ]
    assert not bad, f"(step, flagos, cpu) beyond rtol {LOSS_RTOL}: {bad}"


def test_clipped_gradient_norms_match_cpu(runs: tuple[Run, Run]) -> None:
    on_flagos, on_cpu = runs
    torch.testing.assert_close(
        torch.tensor(on_flagos.norms), torch.tensor(on_cpu.norms), rtol=LOSS_RTOL, atol=1e-6
    )
    assert max(on_cpu.norms) > MAX_NORM, "clipping never engaged: the test would not test it"


def test_final_parameters_match_cpu(runs: tuple[Run, Run]) -> None:
    on_flagos, on_cpu = runs
    expected = dict(on_cpu.model.named_parameters())
    for name, p in on_flagos.model.named_parameters():
        torch.testing.assert_close(
            p.detach().cpu(), expected[name].detach(), rtol=PARAM_RTOL, atol=PARAM_ATOL,
            msg=prefixed(name),
        )


def test_final_buffers_match_cpu(runs: tuple[Run, Run]) -> None:
    # batch_norm's running_mean / running_var / num_batches_tracked
    on_flagos, on_cpu = runs
    expected = dict(on_cpu.model.named_buffers())
    for name, b in on_flagos.model.named_buffers():
        torch.testing.assert_close(b.cpu(), expected[name], rtol=PARAM_RTOL, atol=PARAM_ATOL,
                                   msg=prefixed(name))


def test_optimizer_state_matches_cpu(runs: tuple[Run, Run]) -> None:
    on_flagos, on_cpu = runs
    fl_state = on_flagos.optimizer.state_dict()["state"]
    cpu_state = on_cpu.optimizer.state_dict()["state"]
    assert fl_state.keys() == cpu_state.keys()
    for index in cpu_state:
        for key, value in cpu_state[index].items():
            torch.testing.assert_close(fl_state[index][key].cpu(), value, rtol=PARAM_RTOL,
                                       atol=PARAM_ATOL, msg=prefixed(f"state[{index}][{key!r}]"))


def test_loss_decreases(runs: tuple[Run, Run]) -> None:
    on_flagos, _ = runs
    assert on_flagos.losses[-1] < on_flagos.losses[0]


@pytest.mark.parametrize("model_name", list(MODELS))
def test_eval_forward_matches_cpu(model_name: str) -> None:
    # eval(): batch_norm uses running stats; the transformer layer may take its fast path.
    make_model, make_data = MODELS[model_name]
    model = make_model().eval()
    x, _ = make_data()
    with torch.no_grad():
        expected = model(x)
        got = copy.deepcopy(model).to(FL)(x.to(FL))
    assert got.device.type == FL
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


def test_scaled_dot_product_attention_matches_cpu() -> None:
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 8, 8, generator=gen, requires_grad=True) for _ in range(3))
    out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    fq, fk, fv = (t.detach().to(FL).requires_grad_() for t in (q, k, v))
    fout = nn.functional.scaled_dot_product_attention(fq, fk, fv, is_causal=True)
    fout.sum().backward()
    torch.testing.assert_close(fout.detach().cpu(), out.detach(), rtol=1e-4, atol=1e-5)
    for name, a, b in (("q", fq, q), ("k", fk, k), ("v", fv, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5, msg=prefixed(name))


class _AtenCalls(TorchDispatchMode):
    """Records the ATen operators called under it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mask", ["causal", "additive", "none"])
def test_scaled_dot_product_attention_uses_the_cpus_kernel(mask: str) -> None:
    # Where the CPU runs its fused flash-attention kernel, flagos must too (not
    # the math decomposition, whose float32 gradients differ beyond 1e-5).
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 2, 8, 8, generator=gen) for _ in range(3))
    attn_mask = torch.randn(8, 8, generator=gen) if mask == "additive" else None

    def calls(device: torch.device | str) -> list[str]:
        inputs = [t.to(device) for t in (q, k, v)]
        with _AtenCalls() as mode:
            nn.functional.scaled_dot_product_attention(
                *inputs, attn_mask=None if attn_mask is None else attn_mask.to(device),
                is_causal=mask == "causal")
        return [name for name in mode.names if "attention" in name]

    expected = calls("cpu")
    assert expected, "the CPU ran no attention operator"
    assert calls(FL) == expected


# ------------------------------------------------------------------ more layers, forward + backward

_gen = torch.Generator().manual_seed(1)
IMG = torch.randn(2, 4, 8, 8, generator=_gen)
SEQ = torch.randn(2, 5, 6, generator=_gen)
TOKENS = torch.randint(0, 10, (2, 5), generator=_gen)
LABELS = torch.tensor([3, 0, -1, 1, 2, 5])  # multilabel targets: classes, then -1

LAYERS: dict[str, tuple[Callable[[], nn.Module], tuple[torch.Tensor, ...], Callable]] = {
    "group_norm": (lambda: nn.GroupNorm(2, 4), (IMG,), lambda y: y),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(4, 3, 3, stride=2), (IMG,), lambda y: y),
    "conv2d_strided_dilated_grouped": (
        lambda: nn.Conv2d(4, 4, 3, stride=2, dilation=2, groups=2, padding=2), (IMG,), lambda y: y
    ),
    "conv1d": (lambda: nn.Conv1d(5, 3, 3, padding=1), (SEQ,), lambda y: y),
    "avg_pool2d": (lambda: nn.AvgPool2d(2), (IMG,), lambda y: y),
    "adaptive_avg_pool2d": (lambda: nn.AdaptiveAvgPool2d(3), (IMG,), lambda y: y),
    "upsample_bilinear": (
        lambda: nn.Upsample(scale_factor=2, mode="bilinear"), (IMG,), lambda y: y
    ),
    "lstm": (lambda: nn.LSTM(6, 4, batch_first=True), (SEQ,), lambda y: y[0]),
    "gru": (lambda: nn.GRU(6, 4, batch_first=True, num_layers=2), (SEQ,), lambda y: y[0]),
    "rnn_tanh": (lambda: nn.RNN(6, 4, batch_first=True), (SEQ,), lambda y: y[0]),
    # Fused cells without biases: the LSTM cell's meta function fails on a None
    # bias, the GRU cell's backward returns undefined bias gradients.
    "lstm_no_bias": (lambda: nn.LSTM(6, 4, batch_first=True, bias=False), (SEQ,), lambda y: y[0]),
    "gru_no_bias": (lambda: nn.GRU(6, 4, batch_first=True, bias=False), (SEQ,), lambda y: y[0]),
    # Without reduction, a 1-d input's loss is 0-d on the CPU (one element by the meta function).
    "multilabel_margin_loss_1d_no_reduction": (
        lambda: nn.MultiLabelMarginLoss(reduction="none"), (SEQ[0, 0], LABELS), lambda y: y
    ),
    "embedding_padding_idx": (lambda: nn.Embedding(10, 4, padding_idx=0), (TOKENS,), lambda y: y),
    "embedding_bag_mean": (lambda: nn.EmbeddingBag(10, 4, mode="mean"), (TOKENS,), lambda y: y),
    "multihead_attention_weights": (
        lambda: nn.MultiheadAttention(6, 2, batch_first=True), (SEQ, SEQ, SEQ), lambda y: y[1]
    ),
    "transformer_decoder_layer_norm_first": (
        lambda: nn.TransformerDecoderLayer(6, 2, 12, 0.0, batch_first=True, norm_first=True),
        (SEQ, SEQ), lambda y: y,
    ),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_forward_and_backward_match_cpu(name: str) -> None:
    make_layer, inputs, pick = LAYERS[name]
    torch.manual_seed(0)
    layer = make_layer()
    fl_layer = copy.deepcopy(layer).to(FL)
    cpu_in = [t.clone().requires_grad_() if t.is_floating_point() else t for t in inputs]
    fl_in = [t.detach().to(FL).requires_grad_() if t.is_floating_point() else t.to(FL)
             for t in inputs]
    expected = pick(layer(*cpu_in))
    (expected * torch.linspace(-1, 1, expected.numel()).view_as(expected)).sum().backward()
    actual = pick(fl_layer(*fl_in))
    (actual * torch.linspace(-1, 1, actual.numel(), device=FL).view_as(actual)).sum().backward()
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), rtol=1e-4, atol=1e-5)
    for i, (a, b) in enumerate(zip(fl_in, cpu_in)):
        if b.grad is not None:
            torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5,
                                       msg=prefixed(f"input {i} grad"))
    for (pname, p), q in zip(fl_layer.named_parameters(), layer.parameters()):
        if q.grad is None:
            assert p.grad is None, pname
        else:
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5,
                                       msg=prefixed(f"{pname} grad"))
