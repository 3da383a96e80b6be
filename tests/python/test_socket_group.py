"""--socket-group: the group flagosd gives its unix sockets (default `flagos`
for the system socket). A group that does not exist fails the start, naming
the group and the command that creates it, before anything listens; an
existing one owns the session socket and its staging socket, mode 0660."""

from __future__ import annotations

import grp
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from flagos_test_env import fake_xpu_env, run_backend

MISSING_GROUP = "flagos-test-no-such-group"


def daemon_args(binary: Path, socket: Path, *extra: str) -> list[str]:
    return [str(binary), f"--listen=unix://{socket}", f"--backend={run_backend()}",
            "--cpu-devices=1", "--device-memory=64MiB", "--metrics-listen=", *extra]


def daemon_env() -> dict[str, str]:
    env = dict(os.environ)
    if run_backend() == "kunlunxin":
        env.update(fake_xpu_env(devices="1", memory=str(64 << 20)))
    return env


def wait_until_ready(daemon) -> None:
    """Until the ready line: start_daemon may return once the socket file
    exists, before flagosd has set its group and mode."""
    assert daemon.wait_for_log("listening on", timeout=20), daemon.log()


def another_group_of_ours() -> grp.struct_group | None:
    """A group other than our own that we may give a file to (any, as root)."""
    candidates = [g.gr_gid for g in grp.getgrall()] if os.geteuid() == 0 else os.getgroups()
    for gid in candidates:
        if gid != os.getegid():
            try:
                return grp.getgrgid(gid)
            except KeyError:
                continue
    return None


def test_a_missing_group_fails_the_start_naming_it_and_the_fix(flagosd_binary: Path) -> None:
    with pytest.raises(KeyError):
        grp.getgrnam(MISSING_GROUP)
    with tempfile.TemporaryDirectory(prefix="flagosd.") as workdir:
        socket = Path(workdir) / "d.sock"
        out = subprocess.run(daemon_args(flagosd_binary, socket, f"--socket-group={MISSING_GROUP}"),
                             env=daemon_env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "listening on" not in out.stdout, out.stdout
        assert (f"flagosd: the socket unix://{socket} is to belong to group `{MISSING_GROUP}` "
                "(--socket-group), but no such group exists: create it with "
                f"`addgroup --system {MISSING_GROUP}`") in out.stderr, out.stderr
        # Refused before it listened: no socket file was left behind.
        assert not socket.exists()
        assert not Path(f"{socket}.staging").exists()


def test_the_sockets_belong_to_the_group_asked_for(start_daemon, run_python) -> None:
    group = another_group_of_ours()
    if group is None:
        pytest.skip("this user may give a file to no group but its own (not root, no "
                    "supplementary groups)")
    daemon = start_daemon(extra_args=[f"--socket-group={group.gr_name}"])
    wait_until_ready(daemon)
    for path in (daemon.socket, Path(f"{daemon.socket}.staging")):
        info = path.stat()
        assert info.st_gid == group.gr_gid, (path, info.st_gid, group)
        assert info.st_mode & 0o777 == 0o660, (path, oct(info.st_mode))
    # And it serves: a client computes on it, checked against the CPU.
    out = run_python(
        "import torch, torch_fl\n"
        "x = torch.arange(12.0).reshape(3, 4)\n"
        "y = (x.to('flagos') @ x.t().to('flagos')).cpu()\n"
        "assert torch.equal(y, x @ x.t()), y\n"
        "print('ok')\n",
        env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert out.returncode == 0 and out.stdout == "ok\n", out.stdout + out.stderr


def test_another_socket_keeps_its_group_and_owner_only_mode_by_default(start_daemon) -> None:
    daemon = start_daemon()
    wait_until_ready(daemon)
    info = daemon.socket.stat()
    assert info.st_mode & 0o777 == 0o600, oct(info.st_mode)
    assert info.st_gid == os.getegid()
