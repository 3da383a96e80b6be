"""Which flagosd this process talks to.

1. ``FLAGOS_ENDPOINT`` (``unix:///path`` or ``host:port``) when set;
2. else the system daemon's socket ``/run/flagosd/flagosd.sock`` if it exists;
3. else a private flagosd on a private socket, started here, announced once
   on stderr and stopped when this process exits; ``FLAGOS_ENDPOINT`` then
   names it for this process's children. If it dies, the next session (after
   the lost one, see docs/usage.md) starts another. Its backend is
   ``FLAGOS_BACKEND`` (``cpu`` by default; ``kunlunxin`` or ``auto``); its
   cpu devices share half of the memory the host and this process's cgroup
   can still give (``_host_memory``), so that a program that fills them gets
   ``torch.OutOfMemoryError`` rather than the kernel's OOM killer.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from . import _host_memory

SYSTEM_SOCKET = "/run/flagosd/flagosd.sock"
_START_TIMEOUT_S = 20.0
# Devices of a private daemon's cpu backend (flagosd's default).
PRIVATE_DEVICES = 2

_lock = threading.Lock()
_private: dict = {}


def private_backend() -> str:
    """The backend of a private flagosd: FLAGOS_BACKEND, else cpu."""
    return os.environ.get("FLAGOS_BACKEND", "").strip() or "cpu"


def resolve() -> str:
    endpoint = os.environ.get("FLAGOS_ENDPOINT", "").strip()
    if endpoint and endpoint == _private.get("endpoint") and _private["proc"].poll() is not None:
        # The private daemon this process started has died (its session was
        # lost): start another for the next session.
        return _start_private_daemon()
    if endpoint:
        return endpoint
    if os.path.exists(SYSTEM_SOCKET):
        return "unix://" + SYSTEM_SOCKET
    return _start_private_daemon()


def find_daemon_binary() -> str:
    """FLAGOS_DAEMON, the packaged binary, PATH, then the source tree's build."""
    candidates = []
    if os.environ.get("FLAGOS_DAEMON"):
        candidates.append(os.environ["FLAGOS_DAEMON"])
    here = Path(__file__).resolve().parent
    candidates.append(str(here / "bin" / "flagosd"))
    on_path = shutil.which("flagosd")
    if on_path:
        candidates.append(on_path)
    candidates.append(str(here.parent.parent / "build" / "bin" / "flagosd"))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise RuntimeError(
        "flagos: no FLAGOS_ENDPOINT is set, no system flagosd runs at "
        f"{SYSTEM_SOCKET}, and no flagosd binary was found to start a private one "
        f"(looked at: {', '.join(candidates)}). Set FLAGOS_DAEMON to a flagosd binary "
        "(`scripts/build` makes build/bin/flagosd in a source tree; `pip install .` puts one "
        "in torch_fl/bin), or FLAGOS_ENDPOINT to a running daemon."
    )


def _die_with_parent() -> None:
    # The private daemon ends with this process even if it is SIGKILLed.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:
        pass


def _start_private_daemon() -> str:
    with _lock:
        if "endpoint" in _private and _private["proc"].poll() is None:
            return _private["endpoint"]
        if "workdir" in _private:  # of a private daemon that died
            shutil.rmtree(_private.pop("workdir"), ignore_errors=True)
        binary = find_daemon_binary()
        workdir = tempfile.mkdtemp(prefix="flagosd-")
        os.chmod(workdir, 0o700)
        backend = private_backend()
        socket_path = os.path.join(workdir, "flagosd.sock")
        endpoint = "unix://" + socket_path
        log_path = os.path.join(workdir, "flagosd.log")
        log = open(log_path, "wb")
        # PR_SET_PDEATHSIG fires when the forking *thread* exits: only use it
        # from the main thread; atexit stops the daemon otherwise.
        main_thread = threading.current_thread() is threading.main_thread()
        # flagosd links libtorch: point it at this interpreter's torch, wherever
        # pip put the two packages.
        env = dict(os.environ)
        torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (torch_lib, env.get("LD_LIBRARY_PATH", "")) if p
        )
        device_memory = _host_memory.host_device_memory(PRIVATE_DEVICES)
        proc = subprocess.Popen(
            # A private daemon serves no /metrics (the node's may use the port).
            [binary, f"--listen={endpoint}", f"--backend={backend}", "--metrics-listen=",
             f"--cpu-devices={PRIVATE_DEVICES}", f"--device-memory={device_memory}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if main_thread else None,
            close_fds=True,
        )
        log.close()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not os.path.exists(socket_path):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                tail = Path(log_path).read_text(errors="replace")[-2000:]
                shutil.rmtree(workdir, ignore_errors=True)
                raise RuntimeError(
                    f"flagos: the private flagosd ({binary}) did not start: "
                    f"exit code {proc.returncode}; its log ends with:\n{tail}"
                )
            time.sleep(0.02)
        _private.update(endpoint=endpoint, proc=proc, workdir=workdir)
        # Child processes (torch.multiprocessing, DataLoader workers) reach
        # this daemon too: tensors shared between processes live in one.
        os.environ["FLAGOS_ENDPOINT"] = endpoint
        print(
            f"torch_fl: no FLAGOS_ENDPOINT and no system flagosd at {SYSTEM_SOCKET}; "
            f"started a private flagosd (pid {proc.pid}, backend {backend}"
            + (f", {PRIVATE_DEVICES} devices x {device_memory >> 20} MiB, half of the host's "
               "available memory" if backend != "kunlunxin" else "")
            + f") at {endpoint}; "
            "it stops when this program exits",
            file=sys.stderr,
            flush=True,
        )
        return endpoint


def stop_private_daemon() -> None:
    with _lock:
        proc = _private.pop("proc", None)
        workdir = _private.pop("workdir", None)
        endpoint = _private.pop("endpoint", None)
    if endpoint is not None and os.environ.get("FLAGOS_ENDPOINT") == endpoint:
        del os.environ["FLAGOS_ENDPOINT"]
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)
