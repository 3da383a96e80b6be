"""flagosd's /metrics: scraped over real HTTP, parsed with prometheus_client's
text parser, and checked to move exactly with what a client does."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flagos_test_env import on_kunlunxin

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# The client: each step prints "step <name>" once done and waits for a line
# on stdin before the next, so the test can scrape between steps.
CLIENT = r"""
import sys, torch, torch_fl
def step(name):
    torch.flagos.synchronize()
    print("step", name, flush=True)
    sys.stdin.readline()
N = 3 * 1024 * 1024 + 5
x = torch.empty(N, dtype=torch.uint8, device="flagos")
step("allocated")
host = torch.arange(N, dtype=torch.int64).remainder(251).to(torch.uint8)
x.copy_(host)
step("uploaded")
back = x.cpu()
assert torch.equal(back, host)
step("downloaded")
a = torch.zeros(16, device="flagos")
torch.flagos.synchronize()
step("small")
for _ in range(7):
    a.add_(1)
step("added")
g = torch.accelerator.Graph()
with g:
    for _ in range(5):
        a.add_(1)
for _ in range(3):
    g.replay()  # the first runs the ops as sent, the later ones as prepared
assert a[0].item() == 22.0
step("replayed")
bad = torch.tensor([0, 99], device="flagos")
try:
    torch.index_select(a, 0, bad).cpu()
except Exception as e:
    print("error", type(e).__name__, flush=True)
step("failed")
"""


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not in the scrape: {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


@pytest.fixture
def metrics_daemon(start_daemon: Callable[..., object]):
    return start_daemon(extra_args=["--metrics-listen=127.0.0.1:0"])


def session_bytes(smi: str, endpoint: str) -> int:
    out = subprocess.run([smi, f"--endpoint={endpoint}", "--json"], capture_output=True,
                         text=True, timeout=30, check=True)
    sessions = json.loads(out.stdout)["sessions"]
    assert len(sessions) == 1, sessions
    return int(sessions[0]["segment_bytes"])


def test_counters_move_exactly_with_activity(metrics_daemon, spawn_python, read_line) -> None:
    from test_smi import SMI

    d = metrics_daemon
    url = d.metrics_url()
    route = "cpu_fallback" if on_kunlunxin() else "native"
    other = "native" if on_kunlunxin() else "cpu_fallback"

    before = scrape(url)
    assert value(before, "flagosd_sessions") == 0
    assert value(before, "flagosd_build_info", version="0.1.0", backend=d.backend,
                 torch_version=__import__("torch").__version__.split("+")[0]) == 1

    proc = spawn_python(CLIENT, env={"FLAGOS_ENDPOINT": d.endpoint})

    def at(step: str) -> Samples:
        line = read_line(proc)
        assert line.strip() == f"step {step}", (line, proc.stderr.read() if proc.poll() else "")
        return scrape(url)

    allocated = at("allocated")
    assert value(allocated, "flagosd_sessions") == 1
    assert value(allocated, "flagosd_sessions_opened_total") == value(
        before, "flagosd_sessions_opened_total") + 1
    held = session_bytes(str(SMI), d.endpoint)
    assert held >= 3 * 1024 * 1024
    # Memory used rises by the segments' size, and the allocations counter
    # by as many bytes.
    assert value(allocated, "flagosd_device_memory_used_bytes", device="0") == held
    assert value(allocated, "flagosd_segment_allocated_bytes_total", device="0") == held
    assert value(allocated, "flagosd_segment_allocations_total", device="0") >= 1
    proc.stdin.write("\n"); proc.stdin.flush()

    n = 3 * 1024 * 1024 + 5
    h2d = ("flagosd_copy_bytes_total", {"device": "0", "direction": "host_to_device"})
    d2h = ("flagosd_copy_bytes_total", {"device": "0", "direction": "device_to_host"})
    uploaded = at("uploaded")
    assert value(uploaded, h2d[0], **h2d[1]) - value(allocated, h2d[0], **h2d[1]) == n
    proc.stdin.write("\n"); proc.stdin.flush()
    downloaded = at("downloaded")
    assert value(downloaded, d2h[0], **d2h[1]) - value(uploaded, d2h[0], **d2h[1]) == n
    assert value(downloaded, h2d[0], **h2d[1]) == value(uploaded, h2d[0], **h2d[1])
    proc.stdin.write("\n"); proc.stdin.flush()

    small = at("small")
    proc.stdin.write("\n"); proc.stdin.flush()
    added = at("added")
    ops = lambda s, r: value(s, "flagosd_ops_total", device="0", route=r)  # noqa: E731
    assert ops(added, route) - ops(small, route) == 7
    assert ops(added, other) == ops(before, other) == 0
    count = lambda s: value(s, "flagosd_op_duration_seconds_count", device="0")  # noqa: E731
    assert count(added) - count(small) == 7
    assert value(added, "flagosd_device_busy_seconds_total", device="0") > value(
        before, "flagosd_device_busy_seconds_total", device="0")
    proc.stdin.write("\n"); proc.stdin.flush()

    # A graph's ops count as ops at every replay, prepared or not.
    replayed = at("replayed")
    assert ops(replayed, route) - ops(added, route) == 15
    assert count(replayed) - count(added) == 15
    proc.stdin.write("\n"); proc.stdin.flush()

    assert read_line(proc).startswith("error ")
    failed = at("failed")
    errors = lambda s: value(s, "flagosd_op_errors_total", device="0")  # noqa: E731
    assert errors(failed) - errors(replayed) == 1
    assert errors(added) == errors(before) == 0
    assert value(failed, "flagosd_command_errors_total", code="INVALID_ARGUMENT") - value(
        added, "flagosd_command_errors_total", code="INVALID_ARGUMENT") >= 1
    proc.stdin.write("\n"); proc.stdin.flush()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()

    after = scrape(url)
    assert value(after, "flagosd_sessions") == 0
    assert value(after, "flagosd_device_memory_used_bytes", device="0") == 0
    assert value(after, "flagosd_staging_bytes") == 0
    # The daemon's CPU time, against what the kernel says of its process
    # (read just after the scrape: the kernel's figure may only be larger).
    cpu = lambda s: sum(value(s, "flagosd_cpu_seconds_total", mode=m)  # noqa: E731
                        for m in ("user", "system"))
    fields = open(f"/proc/{d.proc.pid}/stat").read().rsplit(")", 1)[1].split()
    kernel = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    assert cpu(before) < cpu(after) <= kernel + 0.02, (cpu(before), cpu(after), kernel)
    assert kernel - cpu(after) < 1.0, (cpu(after), kernel)


# A training loop, on the CPU and then on flagos (device 0), that prints
# "ok OPS REPEATED": the op calls flagosd ran over its last MEASURED steps on
# flagos and how many of those ran prepared, read from FLAGOS_METRICS_URL;
# it checks the losses and parameters against the CPU's. {model} makes
# `model` (an nn.Module), `make_opt(module)`, `x` and `y`.
REPEATED_LOOP = r"""
import copy, os, re, urllib.request
import torch, torch_fl

def counters():
    text = urllib.request.urlopen(os.environ["FLAGOS_METRICS_URL"], timeout=10).read().decode()
    def total(metric):
        return sum(float(v) for labels, v in re.findall(
            "^" + metric + r"\{([^}]*)\} (\S+)", text, re.M) if 'device="0"' in labels)
    return total("flagosd_ops_total"), total("flagosd_ops_repeated_total")

torch.manual_seed(0)
{model}
STEPS, MEASURED = 16, 6
losses, params = {}, {}
for device in ("cpu", "flagos"):
    m = copy.deepcopy(model).to(device)
    m.train()
    opt = make_opt(m)
    losses[device] = []
    for step in range(STEPS):
        if device == "flagos" and step == STEPS - MEASURED:
            start = counters()
        xd, yd = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(m(xd), yd)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[device].append(loss.item())  # waits for the step's work
    params[device] = [p.detach().cpu() for p in m.parameters()]
end = counters()
torch.testing.assert_close(torch.tensor(losses["flagos"]), torch.tensor(losses["cpu"]),
                           rtol=1e-4, atol=1e-5)
for got, want in zip(params["flagos"], params["cpu"]):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
print("ok", int(end[0] - start[0]), int(end[1] - start[1]), flush=True)
"""

MLP_SGD = """
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                            torch.nn.ReLU(), torch.nn.Linear(64, 4))
make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(8, 64), torch.randint(0, 4, (8,))
"""

# Its activations, gradients and the optimizer's temporaries are allocated
# and freed in the same sizes and order each step, so they land at the same
# addresses (the client's allocator reuses a freed block as it is:
# plugin/csrc/device_allocator.h), and its calls repeat too; AdamW's
# step-dependent scalars do not. Without biases: the key projection's bias
# has no effect on attention (softmax drops a shift), so its gradient is
# zero up to rounding, which AdamW scales up to steps of either sign; CPU
# torch itself, run with 1 and with 2 threads, ends 4e-4 apart on it.
TRANSFORMER_ADAMW = """
layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                         batch_first=True, bias=False)
model = torch.nn.Sequential(layer, torch.nn.Flatten(), torch.nn.Linear(8 * 32, 4))
make_opt = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)
x, y = torch.randn(4, 8, 32), torch.randint(0, 4, (4,))
"""


# The same training step sent again and again: its op calls come byte for
# byte as before (the same tensors at the same addresses), and flagosd runs
# them as the prepared calls it kept (sessions/repeated_op_calls.h), with
# the results of the same loop on the CPU. The shares asserted are below
# those measured over the last 6 of 16 steps (MLP 138 of 138 calls,
# transformer 300 of 342; with biases it was 334 of 372) by a margin; when
# the client's allocator merged each freed block into its free neighbours,
# their tensors landed elsewhere from step to step and 27 and 100 (of 372,
# with biases) of those calls ran prepared.
@pytest.mark.parametrize("model,share", [(MLP_SGD, 0.9), (TRANSFORMER_ADAMW, 0.75)],
                         ids=["mlp_sgd", "transformer_adamw"])
def test_a_training_loops_repeated_calls_run_prepared(metrics_daemon, run_python, model: str,
                                                      share: float) -> None:
    d = metrics_daemon
    out = run_python(REPEATED_LOOP.replace("{model}", model),
                     env={"FLAGOS_ENDPOINT": d.endpoint, "FLAGOS_METRICS_URL": d.metrics_url()})
    assert out.returncode == 0 and out.stdout.startswith("ok "), out.stderr
    ops, repeated = (int(n) for n in out.stdout.split()[1:3])
    assert ops > 0
    if on_kunlunxin():
        # Only native calls are prepared; without xdnn these take cpu_fallback.
        assert 0 <= repeated <= ops
    else:
        assert repeated >= share * ops, (repeated, ops)


def test_out_of_memory_refusals_are_counted(metrics_daemon, run_python) -> None:
    d = metrics_daemon
    before = scrape(d.metrics_url())
    out = run_python(
        "import torch, torch_fl\n"
        "try:\n"
        "    torch.empty(2 * 1024**3, dtype=torch.uint8, device='flagos')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('oom')\n",
        env={"FLAGOS_ENDPOINT": d.endpoint},
    )
    assert out.returncode == 0 and out.stdout.strip() == "oom", out.stderr
    after = scrape(d.metrics_url())
    oom = lambda s: value(s, "flagosd_out_of_memory_total", device="0")  # noqa: E731
    assert oom(after) - oom(before) >= 1


def test_sessions_refused_at_admission_are_counted(start_daemon, run_python) -> None:
    d = start_daemon(extra_args=["--metrics-listen=127.0.0.1:0", "--max-sessions=1"])
    hold = (
        "import sys, torch, torch_fl\n"
        "torch.zeros(1, device='flagos').cpu()\n"
        "print('open', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    holder = subprocess.Popen(
        [__import__("sys").executable, "-c", hold],
        env={**__import__("os").environ, "FLAGOS_ENDPOINT": d.endpoint},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        out = run_python("import torch, torch_fl\ntorch.zeros(1, device='flagos')\n",
                         env={"FLAGOS_ENDPOINT": d.endpoint})
        assert out.returncode != 0 and "RESOURCE_EXHAUSTED" in out.stderr, out.stderr
        samples = scrape(d.metrics_url())
        assert value(samples, "flagosd_sessions_refused_total") == 1
        assert value(samples, "flagosd_rpc_errors_total", code="RESOURCE_EXHAUSTED") == 1
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_vendor_telemetry_only_where_the_backend_has_it(metrics_daemon) -> None:
    samples = scrape(metrics_daemon.metrics_url())
    names = {name for name, _ in samples}
    vendor = {"flagosd_device_temperature_celsius", "flagosd_device_power_watts",
              "flagosd_device_utilization_ratio"}
    if on_kunlunxin():
        # The fake libxpuml's figures (tests/fakes/xpurt/README.md).
        assert value(samples, "flagosd_device_temperature_celsius", device="0") == 45
        assert value(samples, "flagosd_device_power_watts", device="0") == 150
        assert value(samples, "flagosd_device_utilization_ratio", device="0") == 0
    else:
        assert not names & vendor, "the cpu backend has no telemetry: nothing may be invented"


def test_metrics_listen_in_use_fails_when_asked_for(metrics_daemon, flagosd_binary, tmp_path) -> None:
    port = metrics_daemon.metrics_url().split(":")[2].split("/")[0]
    out = subprocess.run(
        [str(flagosd_binary), f"--listen=unix://{tmp_path}/d.sock", "--backend=cpu",
         f"--metrics-listen=127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port} (--metrics-listen)" in out.stderr
    assert "--metrics-listen= to disable" in out.stderr
