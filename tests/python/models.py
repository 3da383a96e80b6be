"""Shared helpers for the model, data-dependent, autocast and state_dict tests.

`same_on_flagos(fn, *args)` runs `fn` on CPU arguments and on flagos copies
of them and checks that the results agree (device, dtype, shape, values);
`make_cnn` and `make_transformer` build the tiny models that
test_models.py trains and test_state_dict.py saves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import torch_fl  # noqa: F401  (registers "flagos")

FL = "flagos"


def to_device(tree: Any, device: str | torch.device) -> Any:
    """A copy of `tree` (tensors, lists, tuples, dicts) with every tensor on `device`."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(to_device(v, device) for v in tree)
    if isinstance(tree, tuple):  # a named tuple (torch.return_types.*)
        return type(tree)(*(to_device(v, device) for v in tree))
    return tree


def assert_same(
    actual: Any,
    expected: Any,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    device_type: str = FL,
    path: str = "result",
) -> None:
    """`actual` (tensors on `device_type`) equals `expected` (CPU) leaf by leaf.

    Tensors must agree in dtype and shape; values exactly when rtol == atol
    == 0, else within torch.testing's tolerances. Non-tensor leaves (Python
    numbers, bools, lists) must be equal.
    """
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)} is not a tensor"
        assert actual.device.type == device_type, f"{path}: on {actual.device}, not {device_type}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        got = actual.cpu()
        if rtol == 0.0 and atol == 0.0:
            assert torch.equal(got, expected), f"{path}:\n{got}\n!=\n{expected}"
        else:
            torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=prefixed(path))
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for k in expected:
            assert_same(actual[k], expected[k], rtol=rtol, atol=atol, device_type=device_type,
                        path=f"{path}[{k!r}]")
        return
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{path}: {type(actual)} is not a sequence"
        assert len(actual) == len(expected), f"{path}: {len(actual)} != {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, rtol=rtol, atol=atol, device_type=device_type, path=f"{path}[{i}]")
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def same_on_flagos(fn: Callable[..., Any], *args: Any, rtol: float = 0.0, atol: float = 0.0) -> Any:
    """fn(*flagos copies of args) equals fn(*args) on the CPU; returns the flagos result."""
    expected = fn(*args)
    actual = fn(*to_device(list(args), FL))
    assert_same(actual, expected, rtol=rtol, atol=atol)
    return actual


def prefixed(name: str) -> Callable[[str], str]:
    """An assert_close `msg` that keeps torch's message after `name`."""
    return lambda message: f"{name}: {message}"


# ------------------------------------------------------------------ models


class SmallCNN(nn.Module):
    """conv2d, batch_norm2d, relu, max_pool2d, dropout, linear: 4x8x8 images, 5 classes."""

    def __init__(self) -> None:
        super().__init__()
        # No bias before batch norm (as ResNet): batch norm cancels it, so its
        # gradient is zero up to rounding, which Adam scales up to steps of
        # either sign: kernels that round differently (a device's) would
        # disagree on it without either being wrong.
        self.conv1 = nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.dropout = nn.Dropout(0.3)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(self.dropout(x.flatten(1)))


class SmallTransformer(nn.Module):
    """Embedding, one TransformerEncoderLayer (batch_first, gelu), layer_norm, mean-pooled head."""

    VOCAB = 20
    D_MODEL = 16

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.VOCAB, self.D_MODEL)
        self.encoder = nn.TransformerEncoderLayer(
            self.D_MODEL, nhead=2, dim_feedforward=32, dropout=0.0, activation="gelu",
            batch_first=True,
        )
        self.norm = nn.LayerNorm(self.D_MODEL)
        self.head = nn.Linear(self.D_MODEL, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.encoder(self.embed(tokens)))
        return self.head(h.mean(dim=1))


def make_cnn(seed: int = 11) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN()


def make_transformer(seed: int = 12) -> SmallTransformer:
    torch.manual_seed(seed)
    return SmallTransformer()


def cnn_data(seed: int = 21) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(16, 4, 8, 8, generator=gen), torch.randint(0, 5, (16,), generator=gen)


def transformer_data(seed: int = 22) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, SmallTransformer.VOCAB, (8, 8), generator=gen)
    return tokens, torch.randint(0, 3, (8,), generator=gen)
