"""8. kunlunxin native route: ops per step by route, cpu_fallback bytes per step.

An MLP (16-64-64-4, ReLU) training step with Adam, batch 8, as people write
it, on two private kunlunxin daemons: one whose route file
scripts/kunlunxin-calibrate wrote on this machine (the native route through
the xdnn binding module, with cpu_fallback where the calibration said so
and for the calls xdnn declines), and one with every operator on
cpu_fallback (no route file: the built-in routes). From each daemon's
/metrics over the measured steps: operator calls per step by route
(`flagosd_ops_total`) and bytes the cpu_fallback route moved per step
(`flagosd_cpu_fallback_bytes_total`); also the step time, beside the same
step on the CPU. Goals: at least 90% of the step's operators native, and
under 2% of the all-fallback bytes moved.

Without XPU_ROOT it runs over the test-only fakes of the build tree (the
fake libxpurt, work completing FAKE_XPU_DELAY_US = 50 us late, and the fake
xdnn_pytorch): the counts are the binding's, the times are the fakes'
(host threads), not a P800's.

Worker mode (run by the parent against each daemon):
    python3 bench/kunlunxin_native.py --worker --steps=N
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import REPO, Context, Row, standalone, stop_process

SECTION = "8. kunlunxin native route (MLP + Adam step)"
NATIVE_SHARE_GOAL = 0.9
BYTES_GOAL = 0.02
FLAGOSD = REPO / "build" / "bin" / "flagosd"
FAKE_XPU_ROOT = REPO / "build" / "tests" / "fakes" / "xpu"
FAKE_MODULE = REPO / "build" / "tests" / "fakes" / "xdnn" / "module" / "libflagos_kunlunxin_xdnn.so"
WARMUP_STEPS = 2


def worker(steps: int) -> None:
    import torch
    import torch_fl  # noqa: F401

    def step_loop(device: str, n: int, model, opt, x, y) -> float:
        start = time.perf_counter()
        for _ in range(n):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        if device == "flagos":
            torch.flagos.synchronize()
        return (time.perf_counter() - start) / n

    out = {}
    for device in ("flagos", "cpu"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(8, 16).to(device)
        y = torch.randint(0, 4, (8,)).to(device)
        step_loop(device, WARMUP_STEPS, model, opt, x, y)
        if device == "flagos":
            print("READY", flush=True)
            sys.stdin.readline()  # the parent reads the metrics before the measured steps
        out[device] = step_loop(device, steps, model, opt, x, y)
    print(json.dumps(out), flush=True)


def _metric(url: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
    return total


def _snapshot(url: str) -> dict[str, float]:
    return {"native": _metric(url, "flagosd_ops_total", route="native"),
            "fallback": _metric(url, "flagosd_ops_total", route="cpu_fallback"),
            "bytes": _metric(url, "flagosd_cpu_fallback_bytes_total")}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if not env.get("XPU_ROOT"):
        env.update(XPU_ROOT=str(FAKE_XPU_ROOT), FAKE_XPU_DELAY_US="50")
    env.setdefault("FLAGOS_KUNLUNXIN_XDNN_MODULE", str(FAKE_MODULE))
    return env


class _Daemon:
    """A kunlunxin flagosd on a Unix socket with /metrics on a loopback port."""

    def __init__(self, workdir: Path, name: str, extra: list[str]) -> None:
        self.socket = workdir / f"{name}.sock"
        self.log_path = workdir / f"{name}.log"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(FLAGOSD), f"--listen=unix://{self.socket}", "--backend=kunlunxin",
                 f"--metrics-listen=127.0.0.1:{port}", *extra],
                env=_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "listening on" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the kunlunxin flagosd did not start:\n{self.log()}")
            time.sleep(0.05)

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)


def _measure(workdir: Path, name: str, extra: list[str], steps: int) -> dict:
    daemon = _Daemon(workdir, name, extra)
    try:
        env = dict(_env(), FLAGOS_ENDPOINT=daemon.endpoint,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "plugin"),
                                                            os.environ.get("PYTHONPATH")])))
        proc = subprocess.Popen([sys.executable, __file__, "--worker", f"--steps={steps}"],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "READY", daemon.log()
        before = _snapshot(daemon.metrics_url)
        proc.stdin.write("\n")
        proc.stdin.flush()
        times = json.loads(proc.stdout.readline())
        after = _snapshot(daemon.metrics_url)
        proc.wait(60)
        # The step's own counts: what the measured flagos steps added.
        return {**{k: (after[k] - before[k]) / steps for k in before}, **times}
    finally:
        daemon.stop()


def run(ctx: Context) -> list[Row]:
    if not FLAGOSD.is_file():
        raise RuntimeError(f"no {FLAGOSD}: build it with scripts/build")
    if not os.environ.get("XPU_ROOT") and not FAKE_MODULE.is_file():
        raise RuntimeError(f"no {FAKE_MODULE}: build the tests with scripts/build")
    steps = ctx.scale(20, 5)
    with tempfile.TemporaryDirectory(prefix="flagos-bench-kunlunxin.") as tmp:
        workdir = Path(tmp)
        conf = workdir / "ops.conf"
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "kunlunxin-calibrate"),
                               f"--out={conf}", f"--flagosd={FLAGOSD}"],
                              env=_env(), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"kunlunxin-calibrate failed:\n{done.stdout}{done.stderr}")
        ctx.log(done.stdout.strip().splitlines()[-1])
        native = _measure(workdir, "native", [f"--ops-conf={conf}"], steps)
        fallback = _measure(workdir, "fallback", [], steps)
    total = native["native"] + native["fallback"]
    ctx.log(f"native route: {native['native']:.1f} native + {native['fallback']:.1f} cpu_fallback "
            f"ops per step, {native['bytes'] / 1024:.1f} KiB of cpu_fallback copies per step; "
            f"all-fallback: {fallback['native'] + fallback['fallback']:.1f} ops, "
            f"{fallback['bytes'] / 1024:.1f} KiB per step")
    return [
        Row(SECTION, "ops per step that ran native", "ops", native["native"], total,
            "ops per step", lower_is_better=False, goal=NATIVE_SHARE_GOAL),
        Row(SECTION, "cpu_fallback bytes per step, native route", "KiB", native["bytes"] / 1024,
            fallback["bytes"] / 1024, "all cpu_fallback", lower_is_better=True, goal=BYTES_GOAL),
        Row(SECTION, "step time, native route (fakes: host threads)", "ms",
            native["flagos"] * 1e3, native["cpu"] * 1e3, "CPU torch", lower_is_better=True,
            extra=True),
        Row(SECTION, "step time, all cpu_fallback (fakes: host threads)", "ms",
            fallback["flagos"] * 1e3, fallback["cpu"] * 1e3, "CPU torch", lower_is_better=True,
            extra=True),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    args, rest = parser.parse_known_args()
    if args.worker:
        worker(args.steps)
    else:
        sys.argv = [sys.argv[0], *rest]
        standalone(run, __doc__.splitlines()[0])
