"""Device-memory quotas and sessions per user: --session-memory-limit,
--uid-memory-limit (per device) and --max-sessions-per-uid. Exceeding a
memory limit raises torch.OutOfMemoryError naming the limit and who holds
the memory; the daemon serves on."""

from __future__ import annotations

import json
import os
import time

import torch_fl

MiB = 1 << 20

# Holds a 40 MiB tensor on flagos:0, says its session, waits for stdin.
HOLDER = """
import json, sys, torch, torch_fl
x = torch.ones(10 * 2**20, device="flagos")   # 40 MiB
torch.flagos.synchronize()
print(json.dumps({"session": torch_fl._C._session_id()}), flush=True)
sys.stdin.read()
"""

# Asks for 40 MiB more; says what happened.
ASKER = """
import json, torch, torch_fl
try:
    y = torch.ones(10 * 2**20, device="flagos")
    torch.flagos.synchronize()
    print(json.dumps({"ok": float(y[:4].sum().cpu())}))
except torch.OutOfMemoryError as e:
    print(json.dumps({"oom": str(e)}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"""


def last_json(out) -> dict:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_session_memory_limit_raises_out_of_memory_naming_it(start_daemon, run_python) -> None:
    daemon = start_daemon(extra_args=["--session-memory-limit=64MiB"])
    code = """
import json, torch, torch_fl
x = torch.ones(10 * 2**20, device="flagos")   # 40 MiB: within the limit
try:
    y = torch.ones(10 * 2**20, device="flagos")
    print(json.dumps({"ok": True}))
except torch.OutOfMemoryError as e:
    # The session goes on: what it holds is intact, smaller work fits, and
    # the other device has a limit of its own.
    z = torch.ones(10 * 2**20, device="flagos:1")
    print(json.dumps({"oom": str(e), "x": float(x.sum().cpu()), "z": float(z.sum().cpu()),
                      "small": float(torch.ones(1024, device="flagos").sum().cpu())}))
"""
    report = last_json(run_python(code, env={"FLAGOS_ENDPOINT": daemon.endpoint}))
    assert "oom" in report, report
    assert "--session-memory-limit is 64MiB (67108864 bytes) per session and device" in \
        report["oom"], report["oom"]
    assert "it holds 40MiB (41943040 bytes) there" in report["oom"], report["oom"]
    assert report["x"] == report["z"] == 10 * MiB and report["small"] == 1024.0
    # Another client is served, and nothing was left behind.
    assert "ok" in last_json(run_python(ASKER, env={"FLAGOS_ENDPOINT": daemon.endpoint}))
    deadline = time.monotonic() + 10
    while (used := [d["used_memory"] for d in torch_fl.daemon_stats(daemon.endpoint)["devices"]]
           ) != [0, 0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert used == [0, 0]


def test_uid_memory_limit_names_the_users_sessions(start_daemon, spawn_python, read_line,
                                                   run_python) -> None:
    daemon = start_daemon(extra_args=["--uid-memory-limit=64MiB"])
    env = {"FLAGOS_ENDPOINT": daemon.endpoint}
    holder = spawn_python(HOLDER, env=env)
    session = json.loads(read_line(holder))["session"]
    report = last_json(run_python(ASKER, env=env))
    assert "oom" in report, report
    assert f"would take uid {os.getuid()} beyond its limit" in report["oom"], report["oom"]
    assert f"(session {session}: 40MiB)" in report["oom"], report["oom"]
    assert "--uid-memory-limit is 64MiB (67108864 bytes) per user and device" in report["oom"]
    holder.communicate(input="", timeout=60)
    # The holder ended: its memory is the user's again.
    assert "ok" in last_json(run_python(ASKER, env=env))


def test_max_sessions_per_uid(start_daemon, spawn_python, read_line, run_python) -> None:
    daemon = start_daemon(extra_args=["--max-sessions-per-uid=1"])
    env = {"FLAGOS_ENDPOINT": daemon.endpoint}
    holder = spawn_python(HOLDER, env=env)
    read_line(holder)
    report = last_json(run_python(ASKER, env=env))
    refused = report.get("error") or report.get("oom")
    assert refused, report
    assert (f"uid {os.getuid()} has 1 sessions open, the most --max-sessions-per-uid=1 allows "
            "one user") in refused, refused
    holder.communicate(input="", timeout=60)
    assert "ok" in last_json(run_python(ASKER, env=env))
