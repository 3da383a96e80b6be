"""A private flagosd's emulated memory follows the host's: its devices share
half of what the host (and this process's memory cgroups) can still give, so
a program that fills them meets torch.OutOfMemoryError before the kernel's
OOM killer (torch_fl/_host_memory.py; docs/usage.md, "Which daemon")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torch_fl import _host_memory
from torch_fl._endpoint import SYSTEM_SOCKET

MiB = 1 << 20
GiB = 1 << 30

MEMINFO = """MemTotal:       24576000 kB
MemFree:         1000000 kB
MemAvailable:    4194304 kB
Buffers:          100000 kB
"""


def test_mem_available_is_read_from_meminfo_in_bytes() -> None:
    assert _host_memory.mem_available(MEMINFO) == 4 * GiB
    assert _host_memory.mem_available("MemTotal: 1 kB\n") is None


def test_devices_share_half_of_what_is_available() -> None:
    # 4 GiB available, 2 devices: 1 GiB each.
    assert _host_memory.private_device_memory(2, 4 * GiB, None) == 1 * GiB
    # A cgroup with less headroom than the host binds.
    assert _host_memory.private_device_memory(2, 4 * GiB, 1 * GiB) == 256 * MiB
    # Whole MiB.
    assert _host_memory.private_device_memory(3, 1 * GiB, None) == 170 * MiB


def test_device_memory_stays_within_flagosds_default_and_a_floor() -> None:
    assert _host_memory.private_device_memory(2, 1024 * GiB, None) == 8 * GiB
    assert _host_memory.private_device_memory(2, 16 * MiB, None) == 64 * MiB
    # Nothing known: flagosd's own default.
    assert _host_memory.private_device_memory(2, None, None) == 8 * GiB


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_headroom_is_the_least_over_the_process_and_its_ancestors(
    tmp_path: Path
) -> None:
    write(tmp_path / "a" / "memory.max", str(8 * GiB))
    write(tmp_path / "a" / "memory.current", str(5 * GiB))  # 3 GiB left
    write(tmp_path / "a" / "b" / "memory.max", "max")
    write(tmp_path / "a" / "b" / "memory.current", str(1 * GiB))
    assert _host_memory.cgroup_headroom("0::/a/b\n", tmp_path) == 3 * GiB


def test_cgroup_v1_headroom_and_its_no_limit_value(tmp_path: Path) -> None:
    memory = tmp_path / "memory" / "job"
    write(memory / "memory.limit_in_bytes", str(2 * GiB))
    write(memory / "memory.usage_in_bytes", str(GiB // 2))
    write(tmp_path / "memory" / "memory.limit_in_bytes", "9223372036854771712")  # none
    write(tmp_path / "memory" / "memory.usage_in_bytes", str(10 * GiB))
    text = "4:memory:/job\n3:cpu,cpuacct:/\n"
    assert _host_memory.cgroup_headroom(text, tmp_path) == GiB + GiB // 2
    assert _host_memory.cgroup_headroom("4:memory:/\n", tmp_path) is None


PROGRAM = """
import json, torch, torch_fl
torch.ones(1, device="flagos")
print(json.dumps([d["total_memory"] for d in torch_fl.daemon_stats()["devices"]]))
"""


@pytest.mark.skipif(SYSTEM_SOCKET and Path(SYSTEM_SOCKET).exists(),
                    reason=f"a system flagosd socket exists at {SYSTEM_SOCKET}: "
                           "torch_fl would use it instead of starting a private daemon")
def test_a_private_daemon_takes_at_most_half_of_the_available_memory(
    run_python, flagosd_binary: Path
) -> None:
    available_before = _host_memory.mem_available(Path("/proc/meminfo").read_text())
    proc = run_python(PROGRAM, env={"FLAGOS_ENDPOINT": None, "FLAGOS_DAEMON": str(flagosd_binary),
                                    "FLAGOS_BACKEND": "cpu"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    totals = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(totals) == 2
    assert len(set(totals)) == 1
    assert totals[0] % MiB == 0
    assert 64 * MiB <= totals[0] <= 8 * GiB
    # Half of what was available, shared: what the program has left is at
    # least the devices' total (unless the host freed as much meanwhile).
    assert sum(totals) <= available_before // 2 + available_before // 8, (totals,
                                                                         available_before)
    # The program is told.
    notice = re.search(r"2 devices x (\d+) MiB, half of the host's available memory",
                       proc.stderr)
    assert notice, proc.stderr
    assert int(notice.group(1)) * MiB == totals[0]
