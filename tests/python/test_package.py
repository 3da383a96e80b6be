"""The Debian package runs without the build tree: scripts/package builds
flagosd_<version>_amd64.deb from build/ (uncompressed, so it takes seconds),
`dpkg-deb -x` unpacks it into a temporary directory, and its flagosd runs
from there with an empty environment (`env -i`), with Python's torch/lib and
the build tree hidden behind empty mounts where the test may mount (a mount
namespace, `unshare`), and serves a client (torch_fl from the source tree)
whose results are checked against CPU torch. Every library the running
daemon mapped (/proc/PID/maps) lies inside the package or in the system's
library directories, every RUNPATH is $ORIGIN-relative, and ldd resolves
every library. The same binary runs the kunlunxin backend over the fake
libxpurt named by XPU_ROOT (the package holds no vendor library).
`cmake --install build --prefix DIR` lays out the same tree.

Measured: the whole file in 55-69 s on the 2-core development machine at
load average 5-10 (other builds running), after scripts/build: 35 s of it
scripts/package (its scripts/build step included), 15 s the client.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagos_test_env import FAKE_XPU_ROOT, REPO

# Where a Debian system keeps the libraries its packages install (the
# dynamic loader lives in /lib64).
SYSTEM_LIB_DIRS = ("/lib/x86_64-linux-gnu/", "/usr/lib/x86_64-linux-gnu/", "/lib64/",
                   "/usr/lib64/")
TORCH_LIBS = ("libc10.so", "libtorch_cpu.so", "libgomp.so.1")


def project_version() -> str:
    match = re.search(r"project\(flagos VERSION (\S+)", (REPO / "CMakeLists.txt").read_text())
    assert match, "no project version in CMakeLists.txt"
    return match.group(1)


def torch_lib_dir() -> Path:
    """The wheel's torch/lib, found without importing torch (seconds)."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin, "torch is not installed for this interpreter"
    return Path(spec.origin).parent / "lib"


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("deb")
    out = subprocess.run(["bash", str(REPO / "scripts/package"), f"--output={out_dir}",
                          "--compression=none"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    path = Path(out.stdout.strip().splitlines()[-1])
    assert path == out_dir / f"flagosd_{project_version()}_amd64.deb", out.stdout
    return path


@pytest.fixture(scope="module")
def root(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package unpacked, as dpkg would install it under /."""
    root = tmp_path_factory.mktemp("root")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, timeout=300)
    return root


def control(deb: Path, field: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), field], check=True, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def elf_files(root: Path) -> list[Path]:
    return sorted([*(root / "usr/bin").iterdir(), *(root / "usr/lib/flagosd").iterdir()])


def runpath(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    match = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", out)
    return match.group(1).split(":") if match else []


def test_the_package_is_named_and_versioned_by_the_project(deb: Path) -> None:
    assert control(deb, "Package") == "flagosd"
    assert control(deb, "Version") == project_version()
    assert control(deb, "Architecture") == "amd64"


def test_the_package_holds_the_binaries_their_torch_libraries_the_unit_and_docs(
        deb: Path, root: Path) -> None:
    for path in ("usr/bin/flagosd", "usr/bin/flagos-smi",
                 *(f"usr/lib/flagosd/{lib}" for lib in TORCH_LIBS),
                 "usr/lib/systemd/system/flagosd.service", "usr/share/flagosd/kunlunxin.conf",
                 "etc/default/flagosd", "usr/share/doc/flagosd/operations.md",
                 "usr/share/doc/flagosd/kunlunxin-installation.md",
                 "usr/share/doc/flagosd/LICENSE.torch"):
        assert (root / path).is_file(), path
    # The torch libraries are the ones the build linked, byte for byte.
    for lib in TORCH_LIBS:
        assert (root / "usr/lib/flagosd" / lib).read_bytes() == (torch_lib_dir() / lib).read_bytes(), lib
    unit = (root / "usr/lib/systemd/system/flagosd.service").read_text()
    assert "\nExecStart=/usr/bin/flagosd --listen=unix:///run/flagosd/flagosd.sock $FLAGOSD_ARGS\n" in unit
    # With prefix /usr the repository's unit is installed as it is.
    assert unit == (REPO / "deploy/systemd/flagosd.service").read_text()
    assert (root / "etc/default/flagosd").read_text() == \
        (REPO / "deploy/systemd/flagosd.default").read_text()
    # No drop-in is active by itself: kunlunxin.conf opens /dev/xpu*.
    assert not (root / "usr/lib/systemd/system/flagosd.service.d").exists()
    conffiles = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], check=True,
                               capture_output=True, timeout=60).stdout
    assert b"./conffiles" in conffiles


def test_the_postinst_creates_the_system_group_flagos_once(deb: Path, tmp_path: Path) -> None:
    ctrl = tmp_path / "ctrl"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(ctrl)], check=True, timeout=60)
    postinst = ctrl / "postinst"
    assert os.access(postinst, os.X_OK)
    # getent and addgroup stand-ins record what the script asks for; the
    # test does not create a group on this machine.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for tool, status in (("getent", "$GETENT_STATUS"), ("addgroup", "0"), ("groupadd", "0"),
                         ("systemctl", "0")):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit {status}\n')
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    subprocess.run([str(postinst), "configure"], env={**env, "GETENT_STATUS": "2"}, check=True,
                   timeout=60)
    assert calls.read_text().splitlines()[:2] == ["getent group flagos", "addgroup --system flagos"]
    calls.unlink()
    # An upgrade, with the group already there, leaves it alone.
    subprocess.run([str(postinst), "configure"], env={**env, "GETENT_STATUS": "0"}, check=True,
                   timeout=60)
    assert calls.read_text().splitlines()[:1] == ["getent group flagos"]
    assert "addgroup" not in calls.read_text()


def test_depends_names_the_debian_packages_of_the_system_libraries(deb: Path) -> None:
    # The reference: dpkg -S on what the build's own flagosd loads from the
    # system (everything but torch's libraries).
    ldd = subprocess.run(["ldd", str(REPO / "build/bin/flagosd")], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    system_libs = [m.group(1) for m in re.finditer(r"=> (/\S+)", ldd)
                   if not any(m.group(1).endswith("/" + lib) for lib in TORCH_LIBS)]
    # One dpkg -S for all (each call reads dpkg's whole file list); a
    # library registered only under its real path is asked for by that.
    queries = {lib: lib for lib in system_libs}
    owners = subprocess.run(["dpkg", "-S", *queries], capture_output=True, text=True,
                            timeout=120).stdout
    owned = {line.split(": ", 1)[1]: line.split(":")[0] for line in owners.splitlines()
             if ": /" in line and not line.startswith("diversion")}
    missing = [lib for lib in system_libs if lib not in owned]
    if missing:
        real = subprocess.run(["dpkg", "-S", *(os.path.realpath(lib) for lib in missing)],
                              capture_output=True, text=True, timeout=120).stdout
        by_real = {line.split(": ", 1)[1]: line.split(":")[0] for line in real.splitlines()
                   if ": /" in line}
        for lib in missing:
            owned[lib] = by_real.get(os.path.realpath(lib), "")
    assert all(owned[lib] for lib in system_libs), \
        [lib for lib in system_libs if not owned[lib]]
    expected = {owned[lib].split(",")[0] for lib in system_libs}
    depends = {item.split()[0] for item in control(deb, "Depends").split(", ")}
    assert expected <= depends, expected - depends
    for pkg in ("libgrpc++1.51", "libprotobuf32", "libsystemd0"):
        assert pkg in depends, (pkg, depends)
    assert "adduser" in depends  # the postinst's addgroup


def test_every_runpath_stays_inside_the_package(root: Path) -> None:
    for path in elf_files(root):
        for entry in runpath(path):
            assert entry.startswith("$ORIGIN"), (path, entry)
            resolved = Path(os.path.normpath(entry.replace("$ORIGIN", str(path.parent))))
            assert resolved == root / "usr/lib/flagosd" or resolved.is_relative_to(root), (path, entry)
    assert runpath(root / "usr/bin/flagosd") == ["$ORIGIN/../lib/flagosd"]


def test_ldd_resolves_every_library_inside_the_package_or_the_system(root: Path) -> None:
    for path in elf_files(root):
        out = subprocess.run(["env", "-i", "ldd", str(path)], check=True, capture_output=True,
                             text=True, timeout=60).stdout
        assert "not found" not in out, (path, out)
        for lib in re.findall(r"=> (/\S+)", out):
            assert lib.startswith(str(root) + "/") or lib.startswith(SYSTEM_LIB_DIRS), (path, lib)
    ldd = subprocess.run(["env", "-i", "ldd", str(root / "usr/bin/flagosd")], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    for lib in TORCH_LIBS:
        assert f"{lib} => {root}/usr/bin/../lib/flagosd/{lib}" in ldd, (lib, ldd)


def hide_command(paths: list[Path]) -> list[str]:
    """A prefix that runs a command with `paths` behind empty mounts, in a
    mount namespace of its own; [] where this machine does not let the test
    mount (no CAP_SYS_ADMIN): then only the maps check below holds."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run(
            [unshare, "--mount", "--propagation", "private", "true"],
            capture_output=True, timeout=60).returncode != 0:
        return []
    mounts = " && ".join(f"mount -t tmpfs -o ro flagos-hidden '{p}'" for p in paths)
    return [unshare, "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh"]


@pytest.fixture
def packaged_daemon(root: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    socket = tmp_path / "d.sock"
    log = tmp_path / "log"
    hidden = [torch_lib_dir(), REPO / "build"]
    command = [*hide_command(hidden), "env", "-i", "PATH=/usr/bin:/bin",
               str(root / "usr/bin/flagosd"), f"--listen=unix://{socket}", "--backend=cpu",
               "--cpu-devices=2", "--device-memory=256MiB", "--metrics-listen="]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True,
                            cwd=tmp_path)
    line = proc.stdout.readline()
    assert "listening on" in line, line + log.read_text()
    yield proc, f"unix://{socket}", log
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def flagosd_pid(proc: subprocess.Popen[str]) -> int:
    """The flagosd process: `proc` itself, or its descendant through unshare, sh and env."""
    pids = [proc.pid]
    while True:
        exe = os.path.realpath(f"/proc/{pids[-1]}/exe")
        if exe.endswith("/flagosd"):
            return pids[-1]
        children = Path(f"/proc/{pids[-1]}/task/{pids[-1]}/children").read_text().split()
        assert children, f"no flagosd below pid {proc.pid}"
        pids.append(int(children[0]))


def test_the_packaged_flagosd_serves_a_client_without_the_build_tree(
        packaged_daemon, root: Path) -> None:
    proc, endpoint, log = packaged_daemon
    pid = flagosd_pid(proc)
    assert os.path.realpath(f"/proc/{pid}/exe") == str(root / "usr/bin/flagosd")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    # The caller's PATH, and what flagosd sets for itself before executing
    # itself again (daemon/openmp_wait_policy.h): nothing from the build tree.
    assert [e for e in environ if e] == [b"PATH=/usr/bin:/bin", b"OMP_WAIT_POLICY=PASSIVE"]
    maps = Path(f"/proc/{pid}/maps").read_text()
    libs = sorted({line.split()[-1] for line in maps.splitlines()
                   if ".so" in line.split()[-1]})
    for lib in libs:
        assert lib.startswith(str(root) + "/") or lib.startswith(SYSTEM_LIB_DIRS), lib
    for lib in TORCH_LIBS:
        assert str(root / "usr/lib/flagosd" / lib) in libs, (lib, libs)
    # A real client, torch_fl from the source tree, checked against CPU torch.
    client = subprocess.run(
        [sys.executable, "-c",
         "import torch, torch_fl\n"
         "torch.manual_seed(0)\n"
         "a, b = torch.randn(64, 32), torch.randn(32, 16)\n"
         "w = torch.randn(16)\n"
         "on = (torch.relu(a.to('flagos') @ b.to('flagos')) * w.to('flagos')).sum(1).cpu()\n"
         "ref = (torch.relu(a @ b) * w).sum(1)\n"
         "torch.testing.assert_close(on, ref)\n"
         "print(torch_fl.daemon_stats()['backend'], len(on))\n"],
        env={**os.environ, "PYTHONPATH": str(REPO / "plugin"), "FLAGOS_ENDPOINT": endpoint},
        capture_output=True, text=True, timeout=180, cwd=REPO)
    assert client.returncode == 0, client.stdout + client.stderr + log.read_text()
    assert client.stdout == "cpu 64\n", client.stdout
    # The packaged flagos-smi reads it too.
    smi = subprocess.run(["env", "-i", str(root / "usr/bin/flagos-smi"), f"--endpoint={endpoint}",
                          "--json"], capture_output=True, text=True, timeout=60)
    assert smi.returncode == 0, smi.stdout + smi.stderr
    stats = json.loads(smi.stdout)
    assert stats["backend"] == "cpu" and len(stats["devices"]) == 2, stats
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()


def test_systemd_analyze_verifies_the_packaged_unit_and_drop_in(root: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/bootstrap installs Debian's systemd"
    units = tmp_path / "units"
    (units / "flagosd.service.d").mkdir(parents=True)
    # verify checks that ExecStart's binary exists: the unpacked one.
    unit = (root / "usr/lib/systemd/system/flagosd.service").read_text()
    (units / "flagosd.service").write_text(
        unit.replace("ExecStart=/usr/bin/flagosd", f"ExecStart={root}/usr/bin/flagosd"))
    shutil.copy(root / "usr/share/flagosd/kunlunxin.conf", units / "flagosd.service.d")
    out = subprocess.run([analyze, "verify", str(units / "flagosd.service")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    noise = [line for line in (out.stdout + out.stderr).splitlines()
             if "flagosd.service" in line or "kunlunxin.conf" in line]
    assert noise == [], noise


def test_cmake_install_lays_out_the_same_tree_under_any_prefix(root: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "opt" / "flagos"
    out = subprocess.run(["cmake", "--install", str(REPO / "build"), "--prefix", str(prefix),
                          "--strip"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr

    def tree(top: Path) -> set[str]:
        return {str(p.relative_to(top)) for p in top.rglob("*") if p.is_file()}

    # The package is this tree with prefix /usr and etc/ moved to /etc.
    packaged = {p.removeprefix("usr/") if p.startswith("usr/") else p for p in tree(root)}
    assert tree(prefix) == packaged
    unit = (prefix / "lib/systemd/system/flagosd.service").read_text()
    assert f"\nExecStart={prefix}/bin/flagosd --listen=" in unit
    assert runpath(prefix / "bin/flagosd") == ["$ORIGIN/../lib/flagosd"]
    started = subprocess.run(["env", "-i", str(prefix / "bin/flagosd"), "--backend=cpu",
                              "--list-served-ops"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    assert "aten::add.Tensor" in started.stdout


def test_the_packaged_flagosd_loads_the_vendor_runtime_from_xpu_root(root: Path, tmp_path: Path) -> None:
    # The P800 recipe's /etc/default/flagosd: FLAGOSD_ARGS="--backend=kunlunxin"
    # and XPU_ROOT, here the fake libxpurt's SDK root (the package holds no
    # vendor library: libxpurt is loaded at start from the node's SDK).
    assert (FAKE_XPU_ROOT / "so" / "libxpurt.so.2").is_file(), \
        "the fake libxpurt is missing: build it with scripts/build fake_xpurt"
    assert not list(root.rglob("libxpurt*"))
    proc = subprocess.Popen(
        ["env", "-i", "PATH=/usr/bin:/bin", f"XPU_ROOT={FAKE_XPU_ROOT}", "FAKE_XPU_DEVICES=2",
         f"FAKE_XPU_MEMORY={64 << 20}", str(root / "usr/bin/flagosd"),
         f"--listen=unix://{tmp_path}/d.sock", "--backend=kunlunxin", "--metrics-listen="],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "listening on" in line and "(backend kunlunxin, 2 devices x 64MiB)" in line, line + err
    assert proc.returncode == 0, err
