"""Who may open a session: the user, group and pid of a session are the
kernel's (the unix socket's peer credentials), and --allow-uid / --allow-gid
refuse everyone else by name.

The client runs as another uid (65534, "nobody") through setpriv
(util-linux): that needs root, which CI has. It keeps CAP_DAC_READ_SEARCH
(ambient) so that it can read the interpreter and torch under /root, and
nothing else: the socket it connects to must still let it write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torch_fl
from flagos_test_env import REPO


def child_env(overrides: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **overrides}


NOBODY = 65534
SMI = REPO / "build" / "bin" / "flagos-smi"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs a client as another uid with setpriv: needs root and util-linux "
    "(CI runs as root)")

# Opens a session (a tensor on the device), says who it is, waits for stdin.
CLIENT = """
import json, os, sys, torch, torch_fl
try:
    x = torch.ones(4, device="flagos") + 1
    torch.flagos.synchronize()
    report = {"pid": os.getpid(), "session": torch_fl._C._session_id(),
              "sum": float(x.sum().cpu())}
except Exception as e:
    report = {"pid": os.getpid(), "error": f"{type(e).__name__}: {e}"}
print(json.dumps(report), flush=True)
sys.stdin.read()
"""


def as_user(uid: int, gid: int, code: str) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
            sys.executable, "-c", code]


def spawn_as(uid: int, gid: int, endpoint: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        as_user(uid, gid, CLIENT), env=child_env({"FLAGOS_ENDPOINT": endpoint, "HOME": "/tmp"}),
        cwd="/tmp", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def report_of(proc: subprocess.Popen[str], read_line) -> dict:
    line = read_line(proc, timeout=120)
    assert line, f"the client exited without a report: {proc.communicate(timeout=30)}"
    return json.loads(line)


def finish(proc: subprocess.Popen[str]) -> None:
    proc.communicate(input="", timeout=60)


def nobodys_report(endpoint: str, read_line) -> tuple[int, dict]:
    """Runs CLIENT as nobody to its report and its end: (its pid, the report)."""
    proc = spawn_as(NOBODY, NOBODY, endpoint)
    try:
        return proc.pid, report_of(proc, read_line)
    finally:
        finish(proc)


def test_a_sessions_user_group_and_pid_are_the_clients(start_daemon, read_line) -> None:
    daemon = start_daemon(extra_args=["--socket-mode=0666"])
    proc = spawn_as(NOBODY, NOBODY, daemon.endpoint)
    try:
        report = report_of(proc, read_line)
        assert "error" not in report, report
        assert report["sum"] == 8.0
        # setpriv execs the interpreter: the same process.
        assert report["pid"] == proc.pid
        sessions = torch_fl.daemon_stats(daemon.endpoint)["sessions"]
        [mine] = [s for s in sessions if int(s["id"]) == report["session"]]
        assert int(mine["uid"]) == NOBODY
        assert int(mine["gid"]) == NOBODY
        assert int(mine["pid"]) == proc.pid
        assert mine["credentials_from_kernel"] is True
        # Its staging region came from the same user: attached.
        assert mine["staging_attached"] is True
        assert re.search(rf"session {report['session']} opened \(pid {proc.pid}, uid {NOBODY}, "
                         rf"gid {NOBODY},", daemon.log()), daemon.log()
        table = subprocess.run([str(SMI)], capture_output=True, text=True, timeout=30,
                               env=child_env({"FLAGOS_ENDPOINT": daemon.endpoint}))
        assert table.returncode == 0, table.stderr
        header = next(line for line in table.stdout.splitlines() if line.startswith("SESSION"))
        assert header.split()[:4] == ["SESSION", "PID", "UID", "GID"]
        row = next(line for line in table.stdout.splitlines()
                   if line.split()[:1] == [str(report["session"])])
        assert row.split()[1:4] == [str(proc.pid), str(NOBODY), str(NOBODY)]
    finally:
        finish(proc)


def test_allow_uid_refuses_another_user_and_serves_on(start_daemon, read_line,
                                                       run_python) -> None:
    daemon = start_daemon(extra_args=["--socket-mode=0666", "--allow-uid=root"])
    pid, report = nobodys_report(daemon.endpoint, read_line)
    assert report.get("error"), report
    assert (f"uid {NOBODY} (gid {NOBODY}, pid {pid}) may not open a session: this "
            "flagosd admits only --allow-uid=0; ask the node's administrator to add the user "
            "or one of its groups") in report["error"], report["error"]
    assert "PERMISSION_DENIED" in report["error"], report["error"]
    assert f"session refused (pid {pid}, uid {NOBODY}, gid {NOBODY})" in daemon.log()
    # The daemon serves its allowed users on.
    ok = run_python("import torch, torch_fl; print(float((torch.ones(3, device='flagos') * 2)"
                    ".sum().cpu()))", env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert ok.returncode == 0 and ok.stdout.strip() == "6.0", ok.stderr
    assert torch_fl.daemon_stats(daemon.endpoint)["sessions"] == [] or all(
        int(s["uid"]) != NOBODY for s in torch_fl.daemon_stats(daemon.endpoint)["sessions"])


def test_allow_gid_admits_the_groups_members(start_daemon, read_line) -> None:
    daemon = start_daemon(extra_args=["--socket-mode=0666", f"--allow-gid={NOBODY}",
                                      "--allow-uid=root"])
    _, report = nobodys_report(daemon.endpoint, read_line)
    assert "error" not in report, report
    assert report["sum"] == 8.0


def test_the_socket_mode_keeps_other_users_out(start_daemon, read_line) -> None:
    # A private daemon's socket is its user's only (0600).
    daemon = start_daemon()
    assert Path(daemon.socket).stat().st_mode & 0o777 == 0o600
    _, report = nobodys_report(daemon.endpoint, read_line)
    assert report.get("error"), report
    path = daemon.endpoint.removeprefix("unix://")
    assert f"permission denied on {path} " in report["error"], report["error"]
    # Its remedy, --socket-mode=0660, is what the next test runs.
    assert ("only its owner may connect: ask whoever runs that flagosd to open it to a group of "
            "yours (--socket-mode=0660)" in report["error"]), report["error"]
    assert "start it" not in report["error"], report["error"]
    assert " opened (" not in daemon.log(), daemon.log()


def test_a_bad_rule_is_refused_at_start(flagosd_binary, tmp_path) -> None:
    out = subprocess.run([str(flagosd_binary), f"--listen=unix://{tmp_path}/s.sock",
                          "--backend=cpu", "--metrics-listen=", "--allow-uid=no-such-user-here"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--allow-uid: no passwd named 'no-such-user-here'" in out.stderr, out.stderr
    out = subprocess.run([str(flagosd_binary), f"--listen=unix://{tmp_path}/s.sock",
                          "--backend=cpu", "--metrics-listen=", "--socket-mode=999"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--socket-mode=999: expected an octal file mode" in out.stderr, out.stderr


def test_permission_denied_names_the_group_whose_members_may_connect(
    start_daemon, read_line
) -> None:
    import grp

    daemon = start_daemon(extra_args=["--socket-mode=0660"])
    group = grp.getgrgid(daemon.socket.stat().st_gid)
    _, report = nobodys_report(daemon.endpoint, read_line)
    message = report.get("error", "")
    assert message.startswith(f"RuntimeError: flagos: permission denied on {daemon.socket}"), report
    # Another daemon would not help: the message says who may connect, not how to start one.
    assert "start it" not in message, message
    assert f"members of group {group.gr_name} may connect" in message, message
    assert f"`usermod -aG {group.gr_name} $USER`" in message, message

    # What usermod gives at the next login: nobody, with that group, connects.
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={group.gr_gid}",
         "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
         sys.executable, "-c", CLIENT],
        env=child_env({"FLAGOS_ENDPOINT": daemon.endpoint, "HOME": "/tmp"}), cwd="/tmp",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        report = report_of(proc, read_line)
    finally:
        finish(proc)
    assert report.get("sum") == 8.0, report
