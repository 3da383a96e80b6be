"""Graphs on flagos (torch.accelerator.Graph, torch.flagos.Graph/graph,
make_graphed_callables): capture records and runs nothing, replays compute
what the same code computes eagerly on the CPU, random ops draw fresh
numbers per replay (those eager draws from the same generator state),
memory stays at its captured addresses, and what a capture cannot hold is
refused with an error that says so. docs/graphs.md."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch_fl

FL = "flagos"


def test_capture_runs_nothing_and_each_replay_runs_the_work_once() -> None:
    x = torch.zeros(16, device=FL)
    y = torch.arange(16, dtype=torch.float32, device=FL)
    g = torch.accelerator.Graph()
    s = torch.flagos.Stream()
    with s, g:
        x.add_(y)
        z = x * 2 + 1
    assert torch.equal(x.cpu(), torch.zeros(16))
    ref_x = torch.zeros(16)
    for _ in range(3):
        g.replay()
        ref_x += torch.arange(16, dtype=torch.float32)
        assert torch.equal(x.cpu(), ref_x)
        assert torch.equal(z.cpu(), ref_x * 2 + 1)


def test_replay_of_new_inputs_copied_into_the_static_ones() -> None:
    a = torch.empty(8, 8, device=FL)
    b = torch.empty(8, 8, device=FL)
    g = torch.flagos.Graph()
    with torch.flagos.graph(g):
        out = torch.relu(a @ b).sum(dim=0).softmax(dim=0)
    for seed in range(4):
        torch.manual_seed(seed)
        ha, hb = torch.randn(8, 8), torch.randn(8, 8)
        a.copy_(ha)
        b.copy_(hb)
        g.replay()
        torch.testing.assert_close(out.cpu(), torch.relu(ha @ hb).sum(dim=0).softmax(dim=0))


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 4))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_captured_training_step_replays_as_the_cpu_trains_eagerly(optimizer: str) -> None:
    cpu = _mlp()
    dev = copy.deepcopy(cpu).to(FL)

    def make(params, capturable: bool):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        # capturable: the step count stays on the device (as for CUDA graphs)
        return torch.optim.Adam(params, lr=1e-2, capturable=capturable)

    opt_cpu, opt_dev = make(cpu.parameters(), False), make(dev.parameters(), True)
    loss_fn = torch.nn.CrossEntropyLoss()
    torch.manual_seed(1)
    xs, ys = torch.randn(12, 8, 64), torch.randint(0, 4, (12, 8))
    sx = torch.empty(8, 64, device=FL)
    sy = torch.empty(8, dtype=torch.long, device=FL)

    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for i in range(3):  # warm-up: optimizer state and gradients exist
        sx.copy_(xs[i])
        sy.copy_(ys[i])
        step(dev, opt_dev, sx, sy)
        step(cpu, opt_cpu, xs[i], ys[i])
    g = torch.flagos.Graph()
    with torch.flagos.graph(g):
        static_loss = step(dev, opt_dev, sx, sy)
    # Adam's capturable form computes the same step in another order.
    tol = dict(rtol=1e-5, atol=1e-6) if optimizer == "sgd" else dict(rtol=1e-4, atol=1e-5)
    for i in range(3, 12):
        sx.copy_(xs[i])
        sy.copy_(ys[i])
        g.replay()
        expected = step(cpu, opt_cpu, xs[i], ys[i])
        torch.testing.assert_close(static_loss.cpu(), expected.detach(), **tol)
    for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu.detach(), **tol)


def test_random_ops_draw_fresh_numbers_each_replay_as_eager_would() -> None:
    torch.manual_seed(7)
    ones = torch.ones(4096, device=FL)
    g = torch.accelerator.Graph()
    with g:
        dropped = torch.nn.functional.dropout(ones, 0.5)
        noise = torch.randn(64, device=FL)
    state = torch.flagos.get_rng_state()
    replays = []
    for _ in range(3):
        g.replay()
        replays.append((dropped.cpu(), noise.cpu()))
    after_replays = torch.rand(8, device=FL).cpu()
    torch.flagos.set_rng_state(state)
    for d, n in replays:
        assert torch.equal(d, torch.nn.functional.dropout(ones, 0.5).cpu())
        assert torch.equal(n, torch.randn(64, device=FL).cpu())
    # The replays advanced the generator as the eager ops did.
    assert torch.equal(after_replays, torch.rand(8, device=FL).cpu())
    assert not torch.equal(replays[0][0], replays[1][0])
    assert 0.4 < (replays[0][0] == 0).float().mean().item() < 0.6


def test_a_reseed_between_replays_is_seen_by_the_next_replay() -> None:
    g = torch.accelerator.Graph()
    with g:
        r = torch.rand(32, device=FL)
    torch.manual_seed(3)
    g.replay()
    first = r.cpu()
    torch.manual_seed(3)
    g.replay()
    assert torch.equal(r.cpu(), first)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(32, device=FL).cpu(), first)


def test_memory_captured_stays_at_its_addresses_while_the_graph_lives() -> None:
    x = torch.ones(1024, device=FL)
    g = torch.accelerator.Graph()
    with g:
        y = x * 3
        tmp = y + 1  # freed after the capture: its block stays the graph's
        z = tmp.sum()
        del tmp
    addresses = (y.data_ptr(), z.data_ptr())
    reserved = torch.flagos.memory_reserved()
    torch.flagos.empty_cache()  # must not give the graph's segments back
    assert torch.flagos.memory_reserved() == reserved
    # Eager work in between takes no block of the graph's pool.
    junk = [torch.full((1024,), 5.0, device=FL) for _ in range(8)]
    g.replay()
    assert (y.data_ptr(), z.data_ptr()) == addresses
    assert torch.equal(y.cpu(), torch.full((1024,), 3.0))
    assert z.item() == 4.0 * 1024
    del junk
    del y, z
    g.reset()
    torch.flagos.empty_cache()
    assert torch.flagos.memory_reserved() < reserved


def test_graphs_can_share_a_pool_and_replay_in_capture_order() -> None:
    x = torch.ones(256, device=FL)
    g1, g2 = torch.flagos.Graph(), torch.flagos.Graph()
    with torch.flagos.graph(g1):
        a = x + 1
    with torch.flagos.graph(g2, pool=g1.pool()):
        b = a * 10
    assert g2.pool() == g1.pool()
    handle = torch.flagos.graph_pool_handle()
    g3 = torch.flagos.Graph()
    with torch.flagos.graph(g3, pool=handle):
        c = b - 1
    assert g3.pool() == handle
    for _ in range(2):
        g1.replay()
        g2.replay()
        g3.replay()
    assert torch.equal(c.cpu(), torch.full((256,), 19.0))


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.sum().item(),
        lambda t: t.cpu(),
        lambda t: torch.flagos.synchronize(),
        lambda t: torch.accelerator.synchronize(),
        lambda t: t.copy_(torch.ones(8)),
        lambda t: torch.nonzero(t),
        lambda t: torch.flagos.current_stream().synchronize(),
    ],
    ids=["item", "cpu", "flagos_synchronize", "accelerator_synchronize", "host_to_device",
         "nonzero", "stream_synchronize"],
)
def test_calls_that_wait_for_the_host_are_refused_during_capture(call) -> None:
    t = torch.ones(8, device=FL)
    g = torch.accelerator.Graph()
    g.capture_begin()
    with pytest.raises(RuntimeError, match="capturing a graph"):
        call(t)
    g.capture_end()
    g.reset()
    # Capture over: the same call works.
    call(t)


def test_modes_decide_what_other_threads_may_do_during_a_capture() -> None:
    t = torch.ones(8, device=FL)
    results: dict[str, str] = {}

    def other_thread(mode: str) -> None:
        try:
            torch.flagos.synchronize(1)
            results[mode] = "ran"
        except RuntimeError as e:
            results[mode] = str(e)

    for mode in ("global", "thread_local", "relaxed"):
        g = torch.flagos.Graph()
        g.capture_begin(capture_error_mode=mode)
        t.add_(1)
        th = threading.Thread(target=other_thread, args=(mode,))
        th.start()
        th.join()
        g.capture_end()
    assert "capturing a graph" in results["global"] and '"global"' in results["global"]
    assert results["thread_local"] == "ran"
    assert results["relaxed"] == "ran"


def test_what_a_capture_cannot_hold_is_refused_naming_it() -> None:
    x = torch.ones(8, device=FL)
    gen = torch.Generator(device=FL)
    g = torch.accelerator.Graph()
    g.capture_begin()
    with pytest.raises(NotImplementedError, match="generator of its own"):
        torch.rand(8, device=FL, generator=gen)
    e = torch.flagos.Event()
    with pytest.raises(NotImplementedError, match="cannot be captured"):
        e.record()
    g.capture_end()
    with pytest.raises(RuntimeError, match="capture_begin"):
        torch.accelerator.Graph().replay()
    g2 = torch.accelerator.Graph()
    g2.capture_begin()
    with pytest.raises(RuntimeError, match="capturing a graph already"):
        torch.accelerator.Graph().capture_begin()
    g2.capture_end()
    with pytest.raises(RuntimeError, match="reset"):
        g2.capture_begin()
    x.sum()


def test_an_optimizer_step_that_is_not_capturable_is_refused_in_a_capture() -> None:
    w = torch.nn.Parameter(torch.ones(4, device=FL))
    opt = torch.optim.Adam([w], lr=0.1)  # capturable=False: its step count on the host
    w.grad = torch.ones(4, device=FL)
    opt.step()
    g = torch.flagos.Graph()
    with pytest.raises(RuntimeError, match="capturable=True"):
        with torch.flagos.graph(g):
            opt.step()
    opt.step()  # outside a capture it steps as before


def test_reset_then_capture_again_keep_graph_and_debug_dump(tmp_path) -> None:
    x = torch.zeros(4, device=FL)
    g = torch.accelerator.Graph(keep_graph=True)
    g.enable_debug_mode()
    with g:
        x.add_(1)
        x.mul_(3)
    g.instantiate()
    g.replay()
    assert torch.equal(x.cpu(), torch.full((4,), 3.0))
    dump = tmp_path / "graph.txt"
    g.debug_dump(str(dump))
    text = dump.read_text()
    assert "2 commands" in text and "aten::add_" in text and "aten::mul_" in text
    g.reset()
    with g:
        x.sub_(1)
    g.replay()
    g.replay()
    assert torch.equal(x.cpu(), torch.full((4,), 1.0))


def test_make_graphed_callables_matches_the_module_run_eagerly_on_the_cpu() -> None:
    cpu = _mlp()
    dev = copy.deepcopy(cpu).to(FL)
    sample = torch.randn(8, 64, device=FL, requires_grad=True)
    graphed = torch.flagos.make_graphed_callables(dev, (sample,))
    for seed in range(3):
        # As a training loop does; the parameters' gradients are the
        # graph's static ones after a replay (as on CUDA).
        dev.zero_grad(set_to_none=True)
        cpu.zero_grad(set_to_none=True)
        torch.manual_seed(10 + seed)
        hx = torch.randn(8, 64)
        x_dev = hx.to(FL).requires_grad_()
        x_cpu = hx.clone().requires_grad_()
        graphed(x_dev).square().sum().backward()
        cpu(x_cpu).square().sum().backward()
        torch.testing.assert_close(x_dev.grad.cpu(), x_cpu.grad, rtol=1e-5, atol=1e-5)
        for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-5)
    # In the other mode the module runs eagerly.
    dev.eval()
    cpu.eval()
    with torch.no_grad():
        torch.testing.assert_close(dev(sample.detach()).cpu(), cpu(sample.detach().cpu()),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("replays_before", [0, 2])
def test_a_replay_naming_memory_given_back_fails_at_the_next_sync(replays_before: int) -> None:
    # After a replay flagosd runs the graph's ops as it decoded them then;
    # memory given back since must still be refused.
    big = torch.ones(1 << 20, device=FL)  # its own segment, outside any graph pool
    g = torch.accelerator.Graph()
    with g:
        big.mul_(2)
    for _ in range(replays_before):
        g.replay()
    assert big[:2].cpu().tolist() == [2.0**replays_before] * 2
    del big
    torch.flagos.empty_cache()  # its segment goes back to flagosd
    g.replay()
    with pytest.raises(RuntimeError, match=r"graph \d+, its command 0 of 1 \(op\)"):
        torch.flagos.synchronize()
    # The session goes on.
    assert torch.ones(2, device=FL).sum().item() == 2.0


def test_replays_stay_right_across_memory_given_back_elsewhere() -> None:
    # Memory given back that the graph does not name: the next replay checks
    # the graph's ranges again (running its ops as sent), later ones run them
    # as decoded before; every one computes what the CPU does.
    x = torch.zeros(64, device=FL)
    w = torch.arange(64, dtype=torch.float32, device=FL)
    g = torch.accelerator.Graph()
    with g:
        x.add_(w)
        x.mul_(0.5)
        y = torch.tanh(x) + w
    ref = torch.zeros(64)
    ref_w = torch.arange(64, dtype=torch.float32)
    for step in range(8):
        if step in (3, 5):
            other = torch.ones(1 << 20, device=FL)
            del other
            torch.flagos.empty_cache()
        g.replay()
        ref = (ref + ref_w) * 0.5
        torch.testing.assert_close(x.cpu(), ref)
        torch.testing.assert_close(y.cpu(), torch.tanh(ref) + ref_w)


@pytest.mark.parametrize(
    "kind,match",
    [
        ("graph_address_outside_segments", "command 0 \\(op\\) names address 0x1000 on flagos:0, outside"),
        ("graph_host_copy", "not one a graph holds"),
        ("graph_id_zero", "graph id 0"),
        ("graph_other_device", "a graph runs on one device"),
        ("replay_unknown_graph", "does not exist in this session"),
    ],
)
def test_the_daemon_refuses_a_malformed_graph(kind: str, match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        torch_fl._C._test_bad_command(kind)
    assert torch.ones(2, device=FL).sum().item() == 2.0


def test_a_hugging_face_gpt2_training_step_captured_replays_as_the_cpu_trains() -> None:
    """A model we did not write, built from its config: GPT-2 (2 layers),
    AdamW with capturable=True, the whole step (forward with labels, loss,
    backward, step) captured once and replayed on new token ids."""
    import transformers  # scripts/bootstrap installs it
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128,
                                     n_positions=32, attn_pdrop=0.0, embd_pdrop=0.0,
                                     resid_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    cpu = transformers.GPT2LMHeadModel(config)
    dev = copy.deepcopy(cpu).to(FL)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-3)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-3, capturable=True)
    batches = [torch.randint(0, 128, (4, 16)) for _ in range(8)]
    static_ids = torch.empty(4, 16, dtype=torch.long, device=FL)

    def step(model, opt, ids):
        opt.zero_grad(set_to_none=False)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    for ids in batches[:3]:
        static_ids.copy_(ids)
        step(dev, opt_dev, static_ids)
        step(cpu, opt_cpu, ids)
    g = torch.flagos.Graph()
    with torch.flagos.graph(g):
        static_loss = step(dev, opt_dev, static_ids)
    for ids in batches[3:]:
        static_ids.copy_(ids)
        g.replay()
        expected = step(cpu, opt_cpu, ids)
        torch.testing.assert_close(static_loss.cpu(), expected.detach(), rtol=1e-4, atol=1e-5)
    # AdamW's capturable form rounds differently: parameters near zero differ
    # in the fifth decimal after five steps.
    for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu.detach(), rtol=1e-4, atol=5e-5)


# A client that captured a graph and queued many replays of it, killed while
# they run: flagosd drops what has not started and frees everything.
REPLAYER = """
import sys, torch, torch_fl
x = torch.ones(1 << 20, device="flagos")
g = torch.accelerator.Graph()
with g:
    for _ in range(20):
        x.mul_(1.0001)
for _ in range(2000):
    g.replay()
print(torch_fl._C._session_id(), flush=True)
sys.stdin.read()
"""


def test_a_client_killed_while_its_replays_run_leaves_nothing(spawn_python, read_line) -> None:
    import os
    import signal
    import time

    def used() -> list[int]:
        return [d["used_memory"] for d in torch_fl.daemon_stats()["devices"]]

    def sessions() -> set[int]:
        return {s["id"] for s in torch_fl.daemon_stats()["sessions"]}

    torch.flagos.synchronize()
    baseline = used()
    proc = spawn_python(REPLAYER)
    line = read_line(proc)
    assert line, proc.communicate(timeout=30)[1]
    session = int(line)
    assert session in sessions()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while (used() != baseline or session in sessions()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert used() == baseline and session not in sessions(), (used(), baseline, sessions())
