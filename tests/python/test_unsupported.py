"""What flagos does not do fails at the call with an error that says what is
unsupported and what works instead: sparse layouts (use dense tensors) and
torch.compile's inductor backend (use backend="aot_eager", which trains a
model on flagos as the CPU does)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch_fl  # noqa: F401
from torch import nn


SPARSE_ADVICE = (
    ": sparse tensors are not supported on flagos (only the strided layout is); use dense "
    'tensors on flagos: keep a sparse tensor on the CPU, or move it with .to_dense().to("flagos")'
)


def sparse_error(op: str) -> str:
    return re.escape(f"flagos: aten::{op}{SPARSE_ADVICE}")


def coo_on_cpu() -> torch.Tensor:
    return torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse()


def dense_on_flagos() -> torch.Tensor:
    return torch.tensor([[0.0, 2.0], [3.0, 0.0]], device="flagos")


# (what the program does, the operator the error names)
SPARSE_CASES = {
    "coo.to(flagos)": (lambda: coo_on_cpu().to("flagos"),
                       "_sparse_coo_tensor_with_dims_and_tensors"),
    "sparse_coo_tensor(device=flagos)": (
        lambda: torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([2.0, 3.0]),
                                        (2, 2), device="flagos"),
        "_sparse_coo_tensor_with_dims_and_tensors"),
    "empty(layout=sparse_coo)": (
        lambda: torch.empty(2, 2, layout=torch.sparse_coo, device="flagos"), "empty.memory_format"),
    "dense.to_sparse()": (lambda: dense_on_flagos().to_sparse(), "_to_sparse"),
    "dense.to_sparse(1)": (lambda: dense_on_flagos().to_sparse(1), "_to_sparse.sparse_dim"),
    "dense.to_sparse_csr()": (lambda: dense_on_flagos().to_sparse_csr(), "_to_sparse_csr"),
    "dense.to_sparse_csc()": (lambda: dense_on_flagos().to_sparse_csc(), "_to_sparse_csc"),
    "dense.to_sparse_bsr()": (lambda: dense_on_flagos().to_sparse_bsr((1, 1)), "_to_sparse_bsr"),
    "dense.to_sparse_bsc()": (lambda: dense_on_flagos().to_sparse_bsc((1, 1)), "_to_sparse_bsc"),
    "csr.to(flagos)": (lambda: coo_on_cpu().to_sparse_csr().to("flagos"),
                       "_sparse_compressed_tensor_unsafe"),
    "sparse_csr_tensor(device=flagos)": (
        lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([1, 0]),
                                        torch.tensor([2.0, 3.0]), (2, 2), device="flagos"),
        "sparse_compressed_tensor.comp_plain_value_size"),
    "sparse_csr_tensor(flagos components)": (
        lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 2], device="flagos"),
                                        torch.tensor([1, 0], device="flagos"),
                                        torch.tensor([2.0, 3.0], device="flagos")),
        "sparse_compressed_tensor.comp_plain_value"),
    "csc.to(flagos)": (lambda: coo_on_cpu().to_sparse_csc().to("flagos"),
                       "_sparse_compressed_tensor_unsafe"),
}


@pytest.mark.parametrize("case", list(SPARSE_CASES))
def test_sparse_layout_is_refused_with_advice(case: str) -> None:
    make, op = SPARSE_CASES[case]
    with pytest.raises(NotImplementedError, match="^" + sparse_error(op) + "$"):
        make()


def test_sparse_refusal_leaves_dense_work_and_cpu_sparse_working() -> None:
    with pytest.raises(NotImplementedError):
        coo_on_cpu().to("flagos")
    # What the error advises works, and the session goes on.
    moved = coo_on_cpu().to_dense().to("flagos")
    assert torch.equal((moved * 2).cpu(), coo_on_cpu().to_dense() * 2)
    assert torch.equal(torch.sparse.mm(coo_on_cpu(), torch.eye(2)), coo_on_cpu().to_dense())


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(torch.nn.functional.gelu(self.fc1(x))))


def test_inductor_is_refused_with_advice() -> None:
    torch._dynamo.reset()
    model = torch.compile(SmallNet().to("flagos"), backend="inductor")
    # Raised before inductor lowers anything, as dynamo's wrapper of a
    # backend's error around the NotImplementedError.
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as raised:
        model(torch.randn(3, 8, device="flagos"))
    assert raised.value.backend_name == "inductor"
    inner = raised.value.inner_exception
    assert type(inner) is NotImplementedError
    assert str(inner) == (
        'flagos: torch.compile(backend="inductor") does not support flagos tensors: inductor '
        "generates device kernels and has no code generator for the flagos device. Compile with "
        'backend="aot_eager" (AOTAutograd graphs, forward and backward, whose operators run on '
        'flagos) or backend="eager", or run the model uncompiled.'
    )
    assert str(inner) in str(raised.value)
    torch._dynamo.reset()


def test_aot_eager_trains_like_the_cpu() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu_model = SmallNet()
    flagos_model = copy.deepcopy(cpu_model).to("flagos")
    batches = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(4)]

    def train(model: nn.Module, device: str, backend: str) -> list[float]:
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        step = torch.compile(model, backend=backend)
        losses = []
        for x, y in batches:
            opt.zero_grad()
            loss = nn.functional.mse_loss(step(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    cpu_losses = train(cpu_model, "cpu", "eager")
    flagos_losses = train(flagos_model, "flagos", "aot_eager")
    torch.testing.assert_close(flagos_losses, cpu_losses)
    for (name, p), q in zip(cpu_model.named_parameters(), flagos_model.parameters()):
        assert q.device.type == "flagos", name
        torch.testing.assert_close(q.cpu(), p, msg=name)
    torch._dynamo.reset()
