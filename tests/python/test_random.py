"""Random numbers on flagos: a generator per device whose state is (seed,
offset), so results repeat under torch.manual_seed in any process.

The numbers differ from the CPU's for the same seed (each op draws from a
generator seeded from (seed, offset)); what is asserted is reproducibility
and the statistics of the draws."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.utils.checkpoint
import torch_fl  # noqa: F401

FL = "flagos"


def draws() -> list[torch.Tensor]:
    return [
        torch.rand(64, device=FL).cpu(),
        torch.randn(64, device=FL).cpu(),
        torch.randint(0, 1000, (64,), device=FL).cpu(),
        torch.empty(64, device=FL).normal_(2.0, 3.0).cpu(),
        torch.empty(64, device=FL).uniform_(-1.0, 1.0).cpu(),
        torch.bernoulli(torch.full((64,), 0.5, device=FL)).cpu(),
        torch.nn.functional.dropout(torch.ones(64, device=FL), 0.5).cpu(),
        torch.randperm(64, device=FL).cpu(),
        torch.multinomial(torch.ones(16, device=FL), 8).cpu(),
    ]


def test_manual_seed_repeats_every_random_op_bit_for_bit() -> None:
    torch.manual_seed(1234)
    first = draws()
    torch.manual_seed(1234)
    second = draws()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_different_seeds_give_different_numbers() -> None:
    torch.manual_seed(1)
    a = torch.rand(64, device=FL).cpu()
    torch.manual_seed(2)
    b = torch.rand(64, device=FL).cpu()
    assert not torch.equal(a, b)


def test_consecutive_draws_differ() -> None:
    torch.manual_seed(5)
    assert not torch.equal(torch.rand(64, device=FL).cpu(), torch.rand(64, device=FL).cpu())


SNIPPET = """
import torch, torch_fl
torch.manual_seed(77)
print(torch.randn(8, device="flagos").cpu().tolist())
"""


def test_manual_seed_repeats_across_processes() -> None:
    outputs = [
        subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=120)
        for _ in range(2)
    ]
    for out in outputs:
        assert out.returncode == 0, out.stderr
    assert outputs[0].stdout == outputs[1].stdout
    torch.manual_seed(77)
    assert outputs[0].stdout.strip() == str(torch.randn(8, device=FL).cpu().tolist())


def test_rng_state_round_trips() -> None:
    torch.flagos.manual_seed(9)
    state = torch.flagos.get_rng_state()
    a = torch.randn(16, device=FL).cpu()
    torch.flagos.set_rng_state(state)
    b = torch.randn(16, device=FL).cpu()
    assert torch.equal(a, b)
    assert torch.flagos.initial_seed() == 9


def test_fork_rng_restores_the_state() -> None:
    torch.manual_seed(3)
    with torch.random.fork_rng(device_type="flagos", devices=[0]):
        torch.randn(16, device=FL)
    a = torch.randn(16, device=FL).cpu()
    torch.manual_seed(3)
    b = torch.randn(16, device=FL).cpu()
    assert torch.equal(a, b)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("device", [0, 1])
def test_activation_checkpointing_recomputes_the_same_dropout_mask(reentrant, device) -> None:
    # torch.utils.checkpoint saves the device's RNG state in the forward
    # pass and restores it for the recomputation in the backward pass, when
    # the device module says it is initialised (torch.flagos._initialized):
    # the checkpointed model's gradients are then those of the plain model.
    dev = f"{FL}:{device}"

    def grads(checkpointed: bool, seed: int = 5) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.3),
                                    torch.nn.GELU(), torch.nn.Linear(32, 4)).to(dev)
        x = torch.randn(8, 16).to(dev).requires_grad_(reentrant)
        torch.manual_seed(seed)
        out = (torch.utils.checkpoint.checkpoint(model, x, use_reentrant=reentrant)
               if checkpointed else model(x))
        out.square().sum().backward()
        return [p.grad.cpu() for p in model.parameters()]

    plain, checkpointed = grads(False), grads(True)
    for a, b in zip(plain, checkpointed):
        assert torch.equal(a, b)
    # The masks are random: another seed gives other gradients.
    assert not torch.equal(plain[0], grads(False, seed=6)[0])


def test_an_explicit_generator_is_independent_of_the_default() -> None:
    g = torch.Generator(device=FL)
    g.manual_seed(42)
    a = torch.randn(16, device=FL, generator=g).cpu()
    torch.manual_seed(0)
    torch.randn(16, device=FL)  # advances only the default generator
    g.manual_seed(42)
    b = torch.randn(16, device=FL, generator=g).cpu()
    assert torch.equal(a, b)


def test_devices_have_their_own_generators() -> None:
    torch.manual_seed(11)
    a0 = torch.rand(16, device="flagos:0").cpu()
    torch.manual_seed(11)
    torch.rand(16, device="flagos:1")  # does not advance device 0's generator
    b0 = torch.rand(16, device="flagos:0").cpu()
    assert torch.equal(a0, b0)


@pytest.mark.parametrize("n", [200_000])
def test_draws_have_the_right_distribution(n: int) -> None:
    torch.manual_seed(21)
    u = torch.rand(n, device=FL).cpu().double()
    z = torch.randn(n, device=FL).cpu().double()
    # Means and deviations within 5 standard errors of their true values.
    assert abs(u.mean().item() - 0.5) < 5 * (1 / 12) ** 0.5 / n**0.5
    assert abs(z.mean().item()) < 5 / n**0.5
    assert abs(z.std().item() - 1.0) < 5 * (0.5 / n) ** 0.5
    assert 0.0 <= u.min().item() and u.max().item() < 1.0


SESSION_DRAWS = """
import hashlib, sys, torch, torch_fl
seed = int(sys.argv[1])
digests = set()
for _ in range(int(sys.argv[2])):
    torch.manual_seed(seed)
    h = hashlib.sha256()
    for _ in range(3):
        # rand takes a generator (explicit); dropout draws from the kernel
        # device's default generator (implicit), which ATen has one of per
        # process: the daemon must never let two sessions' draws interleave.
        h.update(torch.rand(1 << 17, device="flagos").cpu().numpy().tobytes())
        h.update(torch.nn.functional.dropout(torch.ones(1 << 17, device="flagos"), 0.5)
                 .cpu().numpy().tobytes())
    digests.add(h.hexdigest())
print(len(digests), min(digests))
"""


def test_two_sessions_drawing_at_once_each_reproduce_their_own_numbers() -> None:
    def run(*seeds_and_rounds: tuple[int, int]) -> list[str]:
        procs = [
            subprocess.Popen([sys.executable, "-c", SESSION_DRAWS, str(seed), str(rounds)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for seed, rounds in seeds_and_rounds
        ]
        outs = [p.communicate(timeout=300) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err
        return [out.split() for out, _ in outs]

    alone = run((101, 1), (202, 1))
    together = run((101, 30), (202, 30))
    for (count, digest), (_, solo_digest) in zip(together, alone):
        assert count == "1", "a session's draws changed while another session drew"
        assert digest == solo_digest, "a session's draws differ from the same seed drawn alone"
    assert alone[0][1] != alone[1][1]
