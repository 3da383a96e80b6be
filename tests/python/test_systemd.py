"""flagosd under systemd: what a Type=notify unit with WatchdogSec sees on its
notify socket (READY=1, STATUS=, WATCHDOG=1 after passing health checks,
STOPPING=1), a device that stops completing work (the fake libxpurt's
FAKE_XPU_STALL_AFTER) withholding WATCHDOG=1 and still letting SIGTERM end
the daemon, and the shipped unit files accepted by `systemd-analyze verify`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from flagos_test_env import FAKE_XPU_ROOT, REPO, fake_xpu_env, run_backend


class Notifications:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[tuple[float, str]] = []  # (monotonic time, message)

    def collect(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                self.messages.append((time.monotonic(), self.sock.recv(65536).decode()))
            except socket.timeout:
                return

    def wait_for(self, needle: str, seconds: float) -> float:
        """Collects until a message contains `needle`; returns when it came."""
        deadline = time.monotonic() + seconds
        seen = len(self.messages)
        while time.monotonic() < deadline:
            for at, message in self.messages[seen:]:
                if needle in message:
                    return at
            seen = len(self.messages)
            self.collect(min(0.2, max(0.0, deadline - time.monotonic())))
        pytest.fail(f"no {needle!r} within {seconds} s; got {[m for _, m in self.messages]}")

    def times(self, needle: str) -> list[float]:
        return [at for at, message in self.messages if needle in message.split("\n")]

    def close(self) -> None:
        self.sock.close()


def start(flagosd_binary: Path, tmp_path: Path, notify: Notifications, watchdog_usec: int | None,
          *extra: str, backend: str, fake_xpu: dict[str, str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, NOTIFY_SOCKET=str(notify.path))
    env.pop("WATCHDOG_PID", None)
    if watchdog_usec is None:
        env.pop("WATCHDOG_USEC", None)
    else:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    if backend == "kunlunxin":  # two devices of the fake libxpurt
        env.update(fake_xpu_env(devices="2", **fake_xpu))
    return subprocess.Popen(
        [str(flagosd_binary), f"--listen=unix://{tmp_path}/d.sock", f"--backend={backend}",
         "--cpu-devices=2", "--metrics-listen=127.0.0.1:0", *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "wb"))


@pytest.fixture
def notify(tmp_path: Path):
    n = Notifications(tmp_path / "notify.sock")
    yield n
    n.close()


@pytest.fixture
def launch(flagosd_binary: Path, tmp_path: Path, notify: Notifications):
    """launch(watchdog_usec, *extra_args, backend=this run's, fake_xpu={}) -> a flagosd
    reporting to `notify`, on the kunlunxin backend over the fake libxpurt with FAKE_XPU_<KEY>
    settings from `fake_xpu`; killed after."""
    procs: list[subprocess.Popen[bytes]] = []

    def go(watchdog_usec: int | None, *extra: str, backend: str = run_backend(),
           fake_xpu: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = start(flagosd_binary, tmp_path, notify, watchdog_usec, *extra, backend=backend,
                     fake_xpu=fake_xpu or {})
        procs.append(proc)
        return proc

    yield go
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop(proc: subprocess.Popen[bytes], notify: Notifications, status: int = 0) -> None:
    proc.send_signal(signal.SIGTERM)
    notify.wait_for("STOPPING=1", 20)
    assert proc.wait(timeout=30) == status


def metrics_url(tmp_path: Path) -> str:
    log = (tmp_path / "log").read_text()
    return log.split("metrics on ")[1].split()[0].rstrip(";")


def test_ready_status_watchdog_and_stopping(launch, notify: Notifications, tmp_path: Path) -> None:
    proc = launch(1_000_000)
    notify.wait_for("READY=1", 20)
    ready = next(m for _, m in notify.messages if "READY=1" in m)
    assert "STATUS=flagosd 0.1.0 listening on" in ready, ready
    notify.collect(3.0)
    # Every half period (0.5 s) after a passing health check: about six
    # in 3 s; at least four however loaded the machine is.
    beats = notify.times("WATCHDOG=1")
    assert len(beats) >= 4, notify.messages
    assert max(b - a for a, b in zip(beats, beats[1:])) < 1.0, beats
    status = [m for _, m in notify.messages if m.startswith("STATUS=serving")]
    assert status, notify.messages
    assert status[-1] == f"STATUS=serving 2 devices ({run_backend()}), 0 sessions", status
    stop(proc, notify)
    stopping = next(m for _, m in notify.messages if "STOPPING=1" in m)
    assert "STATUS=stopping" in stopping


def test_status_follows_sessions(launch, notify: Notifications, tmp_path: Path, spawn_python,
                                 read_line) -> None:
    proc = launch(1_000_000)
    notify.wait_for("READY=1", 20)
    client = spawn_python(
        "import sys, torch, torch_fl\n"
        "torch.zeros(1, device='flagos').cpu()\n"
        "print('open', flush=True)\n"
        "sys.stdin.readline()\n",
        env={"FLAGOS_ENDPOINT": f"unix://{tmp_path}/d.sock"})
    assert read_line(client) == "open\n"
    notify.wait_for(f"STATUS=serving 2 devices ({run_backend()}), 1 session", 10)
    client.stdin.close()
    client.wait(timeout=30)
    notify.wait_for(f"STATUS=serving 2 devices ({run_backend()}), 0 sessions", 10)
    stop(proc, notify)


def test_a_device_that_stops_completing_work_stops_the_watchdog(
        launch, notify: Notifications, tmp_path: Path) -> None:
    from test_metrics import scrape, value

    assert (FAKE_XPU_ROOT / "so" / "libxpurt.so.2").is_file(), \
        "the fake libxpurt is missing: build it with scripts/build fake_xpurt"
    # The fake's device 1 runs the first 9 operations queued on it and none
    # from the 10th on. Each health probe queues 3 there (a copy to the
    # device, one back, the event its host function waits for), so the
    # first three checks pass and the fourth probe never completes; device
    # 0 keeps working.
    proc = launch(600_000, backend="kunlunxin",
                  fake_xpu={"stall_after": "10@1", "delay_us": "50"})
    notify.wait_for("READY=1", 20)
    stalled_at = notify.wait_for("STATUS=unhealthy", 20)
    unhealthy = next(m for _, m in notify.messages if m.startswith("STATUS=unhealthy"))
    assert unhealthy.startswith(
        "STATUS=unhealthy: device flagos:1 has not completed the health probe's work"), unhealthy
    assert "the device or its kunlunxin runtime has stopped completing work" in unhealthy
    assert "flagos:0" not in unhealthy, unhealthy
    assert [b for b in notify.times("WATCHDOG=1") if b < stalled_at], \
        f"the watchdog was not fed before the stall: {notify.messages}"
    url = metrics_url(tmp_path)
    failures = value(scrape(url), "flagosd_health_check_failures_total")
    assert failures >= 1
    notify.collect(2.5)
    # Not one more WATCHDOG=1 once the checks fail: systemd would kill and
    # restart this daemon after WatchdogSec.
    assert [b for b in notify.times("WATCHDOG=1") if b > stalled_at] == [], notify.messages
    # Every later check fails too, and counts (one every 0.3 s).
    assert value(scrape(url), "flagosd_health_check_failures_total") > failures
    log = (tmp_path / "log").read_text()
    assert "health check failed: device flagos:1 has not completed" in log, log
    assert "withholding WATCHDOG=1" in log
    # SIGTERM still ends it: the device never completes the work the
    # shutdown waits for, so flagosd gives up after 5 s, says why, and
    # exits with status 1.
    stop(proc, notify, status=1)
    log = (tmp_path / "log").read_text()
    assert "shutdown cannot finish: device flagos:1 has not completed" in log, log
    notify.wait_for("STATUS=stopping: shutdown cannot finish: device flagos:1 has not completed", 5)


def test_no_watchdog_without_watchdog_usec(launch, notify: Notifications, tmp_path: Path) -> None:
    proc = launch(None)
    notify.wait_for("READY=1", 20)
    notify.collect(1.5)
    assert notify.times("WATCHDOG=1") == []
    stop(proc, notify)


def test_systemd_analyze_verifies_the_unit_and_its_drop_in(flagosd_binary: Path,
                                                            tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/bootstrap installs Debian's systemd"
    units = tmp_path / "units"
    (units / "flagosd.service.d").mkdir(parents=True)
    # The unit as installed, with ExecStart pointing at this build's binary
    # (verify checks that the command exists).
    text = (REPO / "deploy/systemd/flagosd.service").read_text()
    # The package's path (test_package.py verifies the unit it installs).
    assert "ExecStart=/usr/bin/flagosd " in text
    (units / "flagosd.service").write_text(
        text.replace("ExecStart=/usr/bin/flagosd", f"ExecStart={flagosd_binary}"))
    shutil.copy(REPO / "deploy/systemd/flagosd.service.d/kunlunxin.conf",
                units / "flagosd.service.d/kunlunxin.conf")
    out = subprocess.run([analyze, "verify", str(units / "flagosd.service")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    # Unknown keys and bad values are only warnings to verify: none allowed.
    noise = [line for line in (out.stdout + out.stderr).splitlines()
             if "flagosd.service" in line or "kunlunxin.conf" in line]
    assert noise == [], noise
    for key in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "Group=flagos",
                "EnvironmentFile=-/etc/default/flagosd", "DevicePolicy=closed"):
        assert key in text, key
    directives = [line.split("=", 1)[0] for line in text.splitlines()
                  if line and not line.startswith("#")]
    assert "PrivateDevices" not in directives, "the P800's device nodes must stay visible" 
    drop_in = (REPO / "deploy/systemd/flagosd.service.d/kunlunxin.conf").read_text()
    assert "DeviceAllow=char-xpu rw" in drop_in and "DeviceAllow=/dev/xpuctrl rw" in drop_in
