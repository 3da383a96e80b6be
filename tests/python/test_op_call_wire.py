"""An operator call written straight as wire bytes (plugin/csrc/op_call_wire.h)
is the Command the protobuf encoder builds for it: byte for byte, for every
kind of argument the wire writer takes, and refused (the protobuf path then
runs) for the kinds it does not. Ops whose arguments take either path
compute what the CPU computes.
"""

from __future__ import annotations

import math

import pytest
import torch

import torch_fl  # noqa: F401  (registers "flagos")
from torch_fl import _C

FL = torch.device("flagos", 0)


def encode(args, outputs=(), device=0, stream=3, op_id=7):
    return _C._test_op_call_wire(list(args), list(outputs), device, stream, op_id)


def tensors():
    base = torch.arange(64, dtype=torch.float32).reshape(4, 16).to(FL)
    return {
        "contiguous": base,
        "view with an offset": base[1:],
        "transposed": base.t(),
        "strided slice": base[:, ::3],
        "0-dim": torch.tensor(2.5, device=FL),
        "empty": torch.empty(0, 5, device=FL),
        "uint8 (dtype 0)": torch.ones(3, dtype=torch.uint8, device=FL),
        "int64": torch.arange(5, device=FL),
        "bool": torch.ones(2, 2, dtype=torch.bool, device=FL),
        "conj": torch.ones(3, dtype=torch.complex64, device=FL).conj(),
        "neg": torch._neg_view(torch.ones(3, dtype=torch.complex64, device=FL)),
        "expanded (stride 0)": torch.ones(1, 4, device=FL).expand(3, 4),
        "on device 1": torch.ones(2, device=torch.device("flagos", 1)),
    }


@pytest.mark.parametrize("name", list(tensors()))
def test_a_tensor_argument_and_output_encode_as_protobuf_does(name: str) -> None:
    t = tensors()[name]
    r = encode([t], outputs=[t])
    assert r["wire"], name
    assert r["equal"], (r["wire_text"], r["proto_text"])
    assert r["identical"] and r["wire_bytes"] == r["proto_bytes"]


SCALARS = [None, True, False, 0, 1, -1, 127, 128, 2**62, -(2**63), 2**63 - 1,
           0.0, -0.0, 1.5, -3.25e300, math.inf, -math.inf, [], [3], [-1, 2**40, 0]]


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_a_scalar_or_int_list_encodes_as_protobuf_does(value) -> None:
    r = encode([value])
    assert r["wire"]
    assert r["equal"], (r["wire_text"], r["proto_text"])
    assert r["identical"]


def test_nan_encodes_as_protobuf_does() -> None:
    # NaN != NaN, so the parsed messages cannot compare equal: the bytes do.
    r = encode([math.nan])
    assert r["wire"] and r["identical"]


def test_a_whole_call_encodes_as_protobuf_does() -> None:
    t = tensors()
    args = [t["contiguous"], t["view with an offset"], 2.0, None, [0, 1], True, -5]
    outs = [t["transposed"], None]  # an undefined output too
    for device, stream, op_id in [(0, 0, 0), (1, 3, 7), (7, 2**40, 2**31 + 5)]:
        r = encode(args, outs, device=device, stream=stream, op_id=op_id)
        assert r["wire"] and r["identical"], (r["wire_text"], r["proto_text"])


@pytest.mark.parametrize("value", ["mean", 1 + 2j, torch.ones(2)],
                         ids=["string", "complex", "host tensor"])
def test_kinds_the_wire_writer_does_not_take_go_the_protobuf_way(value) -> None:
    r = encode([torch.ones(2, device=FL), value])
    assert not r["wire"]
    assert r["proto_bytes"] > 0


def test_ops_compute_what_the_cpu_does_on_either_path() -> None:
    a = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    b = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    fa, fb = a.to(FL), b.to(FL)
    # On the wire: tensors, scalars, int lists, None.
    torch.testing.assert_close((fa + fb * 2.5).cpu(), a + b * 2.5, rtol=0, atol=0)
    torch.testing.assert_close(fa.sum(dim=[0]).cpu(), a.sum(dim=[0]))
    torch.testing.assert_close(fa.t()[1:].clamp(min=None, max=0.5).cpu(),
                               a.t()[1:].clamp(min=None, max=0.5), rtol=0, atol=0)
    fa2 = fa.clone()
    fa2.add_(fb, alpha=-3)
    torch.testing.assert_close(fa2.cpu(), a.add(b, alpha=-3), rtol=0, atol=0)
    # The protobuf way: a host 0-dim tensor, a string, a complex scalar.
    torch.testing.assert_close((fa * torch.tensor(3.0)).cpu(), a * 3.0, rtol=0, atol=0)
    torch.testing.assert_close(
        torch.nn.functional.mse_loss(fa, fb, reduction="sum").cpu(),
        torch.nn.functional.mse_loss(a, b, reduction="sum"))
    c = torch.randn(3, dtype=torch.complex64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close((c.to(FL) * (1 + 2j)).cpu(), c * (1 + 2j), rtol=0, atol=0)
    # Random ops draw from the device's generator (the protobuf way too).
    torch.manual_seed(5)
    d1 = torch.nn.functional.dropout(fa, 0.5).cpu()
    torch.manual_seed(5)
    d2 = torch.nn.functional.dropout(fa, 0.5).cpu()
    assert torch.equal(d1, d2)
