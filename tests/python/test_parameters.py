"""model.to("flagos") keeps the module's Parameter objects, as .to("cuda")
does: tied weights stay tied, and an optimizer built before the move trains
the moved model. Each result is compared with the same program on the CPU."""

from __future__ import annotations

import copy

import torch
import torch_fl  # noqa: F401
from torch import nn


def test_to_keeps_parameter_objects_and_grads() -> None:
    m = nn.Linear(3, 2)
    m(torch.randn(4, 3)).sum().backward()
    before = list(m.parameters())
    grads = [p.grad for p in before]
    m.to("flagos")
    after = list(m.parameters())
    assert all(a is b for a, b in zip(before, after))
    assert all(p.device.type == "flagos" for p in after)
    assert all(p.grad is g and g.device.type == "flagos" for p, g in zip(after, grads))
    # And back.
    m.to("cpu")
    assert all(a is b for a, b in zip(before, m.parameters()))
    assert all(p.device.type == "cpu" for p in m.parameters())


def test_data_assignment_moves_between_cpu_and_flagos() -> None:
    p = nn.Parameter(torch.arange(4.0))
    assert torch._has_compatible_shallow_copy_type(p, torch.zeros(4, device="flagos"))
    p.data = torch.full((4,), 2.0, device="flagos")
    assert isinstance(p, nn.Parameter) and p.device.type == "flagos"
    assert p.cpu().tolist() == [2.0] * 4
    # What ATen refuses stays refused: a sparse tensor is not a dense one.
    assert not torch._has_compatible_shallow_copy_type(p, torch.zeros(4).to_sparse())


class TiedLM(nn.Module):
    """A small language model with tied input and output embeddings, as
    GPT-2, BERT and T5 tie them."""

    def __init__(self, vocab: int = 37, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(12, dim) * 0.02)
        self.block = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=32, dropout=0.0,
                                                batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=x.device)
        return self.head(self.norm(self.block(x, src_mask=mask, is_causal=True)))


def test_tied_weights_stay_tied() -> None:
    m = TiedLM()
    m.to("flagos")
    assert m.head.weight is m.embed.weight
    assert m.embed.weight.device.type == "flagos"
    names = [n for n, _ in m.named_parameters()]
    assert "head.weight" not in names  # still one parameter, as on the CPU


def test_optimizer_built_before_to_trains_the_moved_model() -> None:
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    m = copy.deepcopy(ref)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # before .to()
    m.to("flagos")
    x, y = torch.randn(16, 5), torch.randn(16, 1)
    for _ in range(4):
        for model, optimizer, device in ((ref, opt_ref, "cpu"), (m, opt, "flagos")):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
    for a, b in zip(ref.parameters(), m.parameters()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)


def test_tied_language_model_trains_like_the_cpu() -> None:
    torch.manual_seed(1)
    ref = TiedLM()
    m = copy.deepcopy(ref)
    m.to("flagos")
    assert m.head.weight is m.embed.weight
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    tokens = torch.randint(0, 37, (4, 12))
    losses: dict[str, list[float]] = {"cpu": [], "flagos": []}
    for _ in range(5):
        for model, optimizer, device in ((ref, opt_ref, "cpu"), (m, opt, "flagos")):
            optimizer.zero_grad()
            t = tokens.to(device)
            logits = model(t[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, 37), t[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            losses[device].append(loss.item())
        # The tied weight's gradient: embedding and output projection together.
        torch.testing.assert_close(m.embed.weight.grad.cpu(), ref.embed.weight.grad,
                                   rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(losses["flagos"], losses["cpu"], rtol=1e-5, atol=1e-6)
    assert losses["cpu"][-1] < losses["cpu"][0]
    torch.testing.assert_close(m.embed.weight.cpu(), ref.embed.weight, rtol=1e-4, atol=1e-6)
