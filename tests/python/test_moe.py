"""A mixture-of-experts layer trains on flagos as it does on the CPU.

The layer follows the code path of torchtitan's token-choice MoE
(torchtitan/models/moe: TokenChoiceTopKRouter, TokenReorderer, GroupedExperts
run as a for-loop): a linear gate, sigmoid scores in float32, top-k experts
per token, the number of tokens per expert counted with ``torch.histc`` on
the integer expert indices (no device-to-host sync, unlike bincount), tokens
reordered by a stable argsort, each expert a SwiGLU MLP over its slice, and
the weighted outputs scattered back. On the CPU the count takes bincount
instead (the CPU's histc has no integer kernel); on every other device, as
on CUDA, histc on the indices. flagos takes the accelerator path, which
needs CUDA's integer histc (backends/cpu/cpu_dtype_widening.h).

The index dtype is the router's: int64 from topk (torchtitan), or int32 as
routers that narrow the indices keep them.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_fl  # noqa: F401  (registers "flagos")

DIM = 16
HIDDEN = 24
EXPERTS = 4
TOP_K = 2
TOKENS = 48
STEPS = 8


class TopKRouter(nn.Module):
    def __init__(self, index_dtype: torch.dtype) -> None:
        super().__init__()
        self.gate = nn.Linear(DIM, EXPERTS, bias=False)
        self.index_dtype = index_dtype

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scores = torch.sigmoid(self.gate(x).to(torch.float32))
        _, indices = torch.topk(scores, k=TOP_K, dim=-1)
        top_scores = scores.gather(dim=1, index=indices)
        top_scores = top_scores / (top_scores.sum(dim=-1, keepdim=True) + 1e-20)
        indices = indices.to(self.index_dtype)
        flat = indices.reshape(-1)
        if flat.device.type == "cpu":
            counts = torch.bincount(flat, minlength=EXPERTS).to(self.index_dtype)
        else:
            counts = torch.histc(flat, bins=EXPERTS, min=0, max=EXPERTS)
        return top_scores, indices, counts


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM) * DIM**-0.5)
        self.w2 = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN) * HIDDEN**-0.5)
        self.w3 = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM) * DIM**-0.5)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        outputs = []
        for i, tokens in enumerate(torch.split(x, counts.tolist(), dim=0)):
            h = F.silu(tokens @ self.w1[i].transpose(-2, -1)) * (tokens @ self.w3[i].transpose(-2, -1))
            outputs.append(h @ self.w2[i].transpose(-2, -1))
        return torch.cat(outputs, dim=0)


class MoE(nn.Module):
    def __init__(self, index_dtype: torch.dtype) -> None:
        super().__init__()
        self.router = TopKRouter(index_dtype)
        self.experts = Experts()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top_scores, indices, counts = self.router(x)
        order = torch.argsort(indices.reshape(-1), stable=True)
        scores_sorted = top_scores.reshape(-1)[order]
        token_of = order // TOP_K
        routed = torch.gather(x, dim=0, index=token_of.reshape(-1, 1).expand(-1, DIM))
        routed = routed * scores_sorted.reshape(-1, 1)
        expert_out = self.experts(routed, counts)
        out = torch.zeros_like(x).scatter_add(0, token_of.reshape(-1, 1).expand(-1, DIM), expert_out)
        return out, counts


def train(model: nn.Module, device: str) -> tuple[list[float], list[list[int]], nn.Module]:
    model = model.to(device)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(TOKENS, DIM, generator=gen).to(device)
    target = torch.randn(TOKENS, DIM, generator=gen).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    losses, counts_per_step = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        out, counts = model(x)
        loss = F.mse_loss(out, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        counts_per_step.append(counts.tolist())
    return losses, counts_per_step, model


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
def test_moe_layer_trains_on_flagos_as_on_the_cpu(index_dtype: torch.dtype) -> None:
    torch.manual_seed(11)
    initial = MoE(index_dtype)
    cpu_losses, cpu_counts, cpu_model = train(copy.deepcopy(initial), "cpu")
    fl_losses, fl_counts, fl_model = train(copy.deepcopy(initial), "flagos")

    # The router's counts per expert: the same tokens go to the same experts.
    assert fl_counts == cpu_counts
    assert all(sum(c) == TOKENS * TOP_K for c in fl_counts)
    torch.testing.assert_close(torch.tensor(fl_losses), torch.tensor(cpu_losses), rtol=1e-5, atol=1e-6)
    assert cpu_losses[-1] < cpu_losses[0]  # it does train
    for (name, p_cpu), (_, p_fl) in zip(cpu_model.named_parameters(), fl_model.named_parameters()):
        torch.testing.assert_close(p_fl.detach().cpu(), p_cpu.detach(), rtol=1e-5, atol=1e-6, msg=name)


def test_the_router_count_on_flagos_is_cudas_integer_histc() -> None:
    # The accelerator path's count keeps the indices' dtype, like CUDA's histc.
    indices = torch.tensor([[0, 3], [3, 1], [2, 3]], dtype=torch.int32)
    counts = torch.histc(indices.to("flagos").reshape(-1), bins=EXPERTS, min=0, max=EXPERTS)
    assert counts.dtype == torch.int32
    assert counts.cpu().tolist() == torch.bincount(indices.reshape(-1), minlength=EXPERTS).tolist()
