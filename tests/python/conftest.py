"""Integration-test harness: one flagosd for the whole run, plus helpers.

pytest_configure starts build/bin/flagosd (CPU backend, 2 devices of 1 GiB)
on a Unix socket in a temporary directory and sets FLAGOS_ENDPOINT before
any test imports torch_fl. pytest_sessionfinish stops it with SIGTERM and
fails the run if it does not exit 0. Under `pytest -n N` (pytest-xdist, as
scripts/test runs it) each worker has a daemon of its own and the process
that hands out the tests none. A failed test's report ends with its daemon's
log.

FLAGOS_DAEMON overrides the daemon binary (default: <repo>/build/bin/flagosd).

Fixtures: `endpoint`, `flagosd_binary`, `run_python` (a snippet in a fresh
interpreter with this run's environment), `spawn_python` (the same, left
running), `start_daemon` (an extra private daemon, stopped after the test).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

# Importable also when this file is loaded by path (tests/opinfo/driver.py).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from flagos_test_env import (REPO, fake_xpu_env, is_xdist_controller, parse_bytes,  # noqa: E402
                             run_backend)

PLUGIN_DIR = REPO / "plugin"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0

if str(PLUGIN_DIR) not in sys.path:
    sys.path.insert(0, str(PLUGIN_DIR))


def flagosd_path() -> Path:
    return Path(os.environ.get("FLAGOS_DAEMON") or REPO / "build" / "bin" / "flagosd")


class Daemon:
    """A flagosd child process listening on a Unix socket in `workdir`."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        *,
        cpu_devices: int = 2,
        device_memory: str = "1GiB",
        extra_args: Sequence[str] = (),
        backend: str | None = None,
        env: Mapping[str, str | None] | None = None,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.socket = workdir / "flagosd.sock"
        self.endpoint = f"unix://{self.socket}"
        self.log_path = workdir / "flagosd.log"
        self.backend = backend or run_backend()
        self.args = [
            str(binary),
            f"--listen={self.endpoint}",
            f"--backend={self.backend}",
            f"--cpu-devices={cpu_devices}",
            f"--device-memory={device_memory}",
            # No /metrics unless a test asks (--metrics-listen=127.0.0.1:0).
            *([] if any(a.startswith("--metrics-listen") for a in extra_args)
              else ["--metrics-listen="]),
            *extra_args,
        ]
        # The kunlunxin pass over the fake xdnn_pytorch (scripts/test's
        # kunlunxin-xdnn): the route file its calibration wrote; the binding
        # module comes from FLAGOS_KUNLUNXIN_XDNN_MODULE.
        ops_conf = os.environ.get("FLAGOS_TEST_OPS_CONF")
        if (ops_conf and self.backend == "kunlunxin"
                and not any(a.startswith("--ops-conf") for a in extra_args)):
            self.args.append(f"--ops-conf={ops_conf}")
        # The kunlunxin backend's devices are the fake runtime's: the same
        # device count and memory through its variables.
        self.env = dict(os.environ)
        if self.backend == "kunlunxin":
            self.env.update(fake_xpu_env(devices=str(cpu_devices),
                                         memory=str(parse_bytes(device_memory))))
        for key, value in (env or {}).items():
            if value is None:
                self.env.pop(key, None)
            else:
                self.env[key] = value
        self.proc: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, text: str, timeout: float = READY_TIMEOUT_S) -> bool:
        """Whether `text` appears in the log within `timeout` (start() may
        return when the socket appears, before flagosd logs its ready line
        and what follows it)."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def metrics_url(self) -> str:
        """The daemon's /metrics URL, from its ready line ("metrics on http://...")."""
        # start() may return when the socket appears, before the ready line.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (match := re.search(r"metrics on (http://\S+/metrics)", self.log())):
            if "listening on" in self.log() or time.monotonic() > deadline:
                raise AssertionError("flagosd serves no metrics (start it with "
                                     f"--metrics-listen=...):\n{self.log()}")
            time.sleep(0.02)
        return match.group(1)

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Starts the daemon and waits until it says "listening on" (or its socket exists)."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.args,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "listening on" in self.log() or self.socket.is_socket():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"flagosd exited with {self.proc.returncode} before it was ready:\n"
                    f"$ {' '.join(self.args)}\n{self.log()}"
                )
            time.sleep(0.02)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(
            f"flagosd was not ready within {timeout} s:\n$ {' '.join(self.args)}\n{self.log()}"
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then waits; returns the exit code, None if it had to be killed."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


_main_daemon: Daemon | None = None
_main_workdir: tempfile.TemporaryDirectory[str] | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _main_daemon, _main_workdir
    if is_xdist_controller(config):
        return
    binary = flagosd_path()
    if not binary.is_file():
        pytest.exit(f"no flagosd at {binary}: build it with scripts/build", returncode=4)
    _main_workdir = tempfile.TemporaryDirectory(prefix="flagos-test.")
    _main_daemon = Daemon(binary, Path(_main_workdir.name))
    try:
        _main_daemon.start()
    except RuntimeError as e:
        pytest.exit(str(e), returncode=4)
    # Before anything imports torch_fl: it reads this at its first use.
    os.environ["FLAGOS_ENDPOINT"] = _main_daemon.endpoint
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(PLUGIN_DIR)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )


# What the workers' daemons did wrong at their stop (pytest -n: collected
# in the controlling process, which fails the run with them).
_workers_daemon_failures: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _main_daemon
    for failure in _workers_daemon_failures:
        sys.stderr.write(failure)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if _main_daemon is None:
        return
    daemon, _main_daemon = _main_daemon, None
    code = daemon.stop()
    if code != 0:
        what = "did not exit within 15 s of SIGTERM" if code is None else f"exited with {code}"
        failure = (f"\nFAILED: the test flagosd {what} on SIGTERM (expected 0). Its log:\n"
                   f"{daemon.log()[-4000:]}\n")
        sys.stderr.write(failure)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        # A pytest-xdist worker's exit status does not reach the controlling
        # process (it counts test reports): the failure travels in the
        # worker's output, to pytest_testnodedown below.
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput["flagosd_failure"] = failure


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, in the controlling process: a worker finished (or died)."""
    failure = getattr(node, "workeroutput", {}).get("flagosd_failure")
    if failure:
        _workers_daemon_failures.append(f"\n[worker {node.gateway.id}]{failure}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test's report ends with the last 40 lines of the run's daemon log
    (daemon-side errors are there; under pytest -n, each worker has its own daemon)."""
    report = yield
    if report.failed and _main_daemon is not None:
        lines = _main_daemon.log().splitlines()[-40:]
        if lines:
            report.sections.append(("flagosd log (last 40 lines)", "\n".join(lines)))
    return report


def pytest_unconfigure(config: pytest.Config) -> None:
    # After an interrupted run sessionfinish may not have stopped it.
    global _main_daemon, _main_workdir
    if _main_daemon is not None:
        _main_daemon.stop()
        _main_daemon = None
    if _main_workdir is not None:
        _main_workdir.cleanup()
        _main_workdir = None


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def flagosd_binary() -> Path:
    return flagosd_path()


@pytest.fixture(scope="session")
def endpoint() -> str:
    """The endpoint of the run's daemon (also in os.environ["FLAGOS_ENDPOINT"])."""
    assert _main_daemon is not None
    return _main_daemon.endpoint


def child_env(overrides: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """This run's environment for a child interpreter; a None value removes a variable."""
    env = dict(os.environ)
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


RunPython = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_python() -> RunPython:
    """run_python(code, env={...}, timeout=120) -> CompletedProcess with text stdout/stderr.

    Runs `code` with this interpreter in a fresh process that talks to the
    run's daemon unless `env` says otherwise. Raises on timeout.
    """

    def run(
        code: str, *, env: Mapping[str, str | None] | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code],
            env=child_env(env),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def spawn_python() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """spawn_python(code, env={...}) -> Popen with text pipes; killed after the test."""
    procs: list[subprocess.Popen[str]] = []

    def spawn(code: str, *, env: Mapping[str, str | None] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env=child_env(env),
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def thread_stacks(pid: int) -> str:
    """Every thread's native stack of process `pid` (gdb), for a hang's report."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(gdb is not installed: no stacks)"
    try:
        out = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "(gdb did not finish within 60 s)"
    lines = [line for line in out.stdout.splitlines() if line.startswith(("#", "Thread"))]
    return "\n".join(lines)[-12000:]


@pytest.fixture
def read_line() -> Callable[..., str]:
    """read_line(proc, timeout=120) -> the next line of a spawned child's stdout.

    "" if the child closed stdout (exited); fails the test on timeout.
    """

    # Bytes read past the last line returned, per child. The descriptor is
    # read directly: a buffered readline() could take two lines at once,
    # and select() would then wait for a second line already read.
    pending: dict[int, bytes] = {}

    def read(proc: subprocess.Popen[str], timeout: float = 120.0) -> str:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buffered = pending.pop(id(proc), b"")
        deadline = time.monotonic() + timeout
        while b"\n" not in buffered:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                stacks = thread_stacks(proc.pid)
                proc.kill()
                pytest.fail(f"no output from the child within {timeout} s (so far: "
                            f"{buffered!r}); its threads:\n{stacks}")
            chunk = os.read(fd, 65536)
            if not chunk:  # the child closed stdout
                return buffered.decode()
            buffered += chunk
        line, _, rest = buffered.partition(b"\n")
        pending[id(proc)] = rest
        return (line + b"\n").decode()

    return read


@pytest.fixture
def start_daemon(flagosd_binary: Path) -> Iterator[Callable[..., Daemon]]:
    """start_daemon(cpu_devices=2, device_memory="1GiB", extra_args=(), backend=None, env=None)
    -> a ready Daemon (backend: the run's unless given; env: variables set or removed).

    Each daemon is stopped after the test, which fails if one does not exit 0.
    """
    daemons: list[Daemon] = []

    def start(**kwargs: object) -> Daemon:
        # Its own short directory: Unix socket paths are limited to 107 bytes.
        workdir = Path(tempfile.mkdtemp(prefix="flagosd."))
        daemon = Daemon(flagosd_binary, workdir, **kwargs)  # type: ignore[arg-type]
        daemons.append(daemon)
        daemon.start()
        return daemon

    yield start
    codes = [(d.endpoint, d.stop()) for d in daemons]
    for d in daemons:
        shutil.rmtree(d.workdir, ignore_errors=True)
    bad = [(e, c) for e, c in codes if c != 0]
    assert not bad, f"extra flagosd did not exit 0 on SIGTERM: {bad}"
