"""Collectives through BKCL on the kunlunxin backend (docs/distributed.md,
docs/vendors/kunlunxin/runtime-api-map.md), over the test-only fakes of
libxpurt and libbkcl (tests/fakes/xpurt, tests/fakes/bkcl): device memory the
host cannot address, work that completes late.

Each test starts its own kunlunxin daemons whatever the run's backend (the
cpu pass runs this file; in the kunlunxin pass test_distributed.py already
runs every workload through the fake BKCL). The workloads are
tests/distributed/workload.py's, checked against plain torch on the CPU.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from flagos_test_env import FAKE_XPU_ROOT, fake_xpu_env, on_kunlunxin
from test_distributed import launch, metrics, ok, quiet, reports, settled, summed, torchrun

pytestmark = pytest.mark.skipif(
    on_kunlunxin(), reason="runs its own kunlunxin daemons in the cpu pass; the kunlunxin pass "
                           "runs test_distributed.py through the fake BKCL")

FAKE_BKCL = FAKE_XPU_ROOT / "so" / "libbkcl.so"


def start(start_daemon, **env: str):
    return start_daemon(backend="kunlunxin", extra_args=["--metrics-listen=127.0.0.1:0"],
                        env={**fake_xpu_env(delay_us="200"), **env})


def test_the_collectives_run_through_bkcl_and_match_their_arithmetic(start_daemon) -> None:
    assert FAKE_BKCL.exists(), f"{FAKE_BKCL} was not built"
    daemon = start(start_daemon)
    assert re.search(r"collectives run through BKCL \(\S*libbkcl\.so\)", daemon.log()), daemon.log()
    ok(torchrun(daemon, "collectives"), "collectives")
    after = settled(daemon, quiet)
    total = after["flagosd_collectives_total"]
    by_bkcl = after["flagosd_collectives_by_library_total"]
    # sum/product/min/max of float32, bfloat16, float16, int64 sums,
    # broadcasts, gathers, reduce-scatters, even all-to-alls ran on BKCL; avg,
    # the bitwise reductions, the transposed view, uneven splits and
    # send/recv on the host route.
    assert by_bkcl >= 12, after
    assert total - by_bkcl >= 8, after
    assert after["flagosd_collective_failures_total"] == 0, after
    assert quiet(after), after


def test_bkcl_takes_every_collective_byte_off_the_host_route(start_daemon) -> None:
    # The same job (4 allreduces of 16 MiB per rank) with BKCL and without:
    # on the host route each allreduce copies each rank's 16 MiB to the host
    # and back; through BKCL none of it moves.
    moved = {}
    for name, env in (("bkcl", {}), ("off", {"FLAGOS_KUNLUNXIN_BKCL": "off"})):
        daemon = start(start_daemon, **env)
        ok(torchrun(daemon, "large"), "large")
        after = settled(daemon, quiet)
        moved[name] = summed(after, "flagosd_cpu_fallback_bytes_total")
        assert after["flagosd_collectives_by_library_total"] == (0 if name == "off" else
                                                                 after["flagosd_collectives_total"])
    collective_bytes = 2 * 4 * 2 * (16 << 20)  # ranks x allreduces x (to host + back) x 16 MiB
    assert moved["off"] - moved["bkcl"] >= collective_bytes, moved


def test_a_failing_bkcl_call_fails_the_collective_on_every_rank(start_daemon, run_python) -> None:
    daemon = start(start_daemon, FAKE_BKCL_FAIL="all_reduce")
    results = launch(daemon, "library_failure", FLAGOS_TEST_PG_TIMEOUT_S="60")
    for code, out, err in results:
        assert code == 0, out + err[-6000:]
        lines = reports(out, "library_failure")
        assert len(lines) == 2, out
        # The library's error names the call and its result; the broken
        # group's next collective fails at once with it.
        for line in lines:
            assert re.search(r"bkcl_all_reduce failed: BKCL_RUNTIME_ERROR \(2\)", line), line
    after = settled(daemon, quiet)
    assert after["flagosd_collective_failures_total"] == 1, after
    assert quiet(after), after
    check = run_python("import torch, torch_fl; print((torch.ones(3, device='flagos') * 2).sum().item())",
                       env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert check.returncode == 0 and check.stdout.strip() == "6.0", check.stderr


def between(daemons) -> dict[str, str]:
    """Rank r on daemons[r]: a group that spans daemons (a private daemon per rank)."""
    return {"FLAGOS_TEST_ENDPOINTS": ",".join(d.endpoint for d in daemons)}


def quiet_between(samples: dict[str, float]) -> bool:
    return quiet(samples) and samples.get("flagosd_ranks_between_daemons", -1) == 0


def test_between_daemons_the_collectives_run_through_bkcl_on_device_memory(start_daemon) -> None:
    # Two kunlunxin daemons, one rank each: the ranks' BKCL communicator
    # spans the daemons (its id through the job's Store; the fake BKCL's
    # ranks meet across processes). Every collective matches its arithmetic;
    # BKCL carries what it takes, gloo the rest.
    daemons = [start(start_daemon) for _ in range(2)]
    ok(torchrun(daemons[0], "collectives", **between(daemons)), "collectives")
    for d in daemons:
        after = settled(d, quiet_between)
        by_bkcl = after["flagosd_collectives_by_library_total"]
        total = after["flagosd_collectives_between_daemons_total"]
        assert by_bkcl >= 12 and total - by_bkcl >= 8, after
        assert after["flagosd_collective_between_daemons_failures_total"] == 0, after
        assert after["flagosd_collectives_total"] == 0, after  # none met in one daemon
        assert quiet_between(after), after
    # The same 4 allreduces of 16 MiB per rank with BKCL and without: through
    # BKCL no collective byte takes the host route (device -> host -> gloo).
    moved = {}
    for name, env in (("bkcl", {}), ("off", {"FLAGOS_KUNLUNXIN_BKCL": "off"})):
        pair = [start(start_daemon, **env) for _ in range(2)]
        ok(torchrun(pair[0], "large", **between(pair)), "large")
        moved[name] = sum(summed(settled(d, quiet_between), "flagosd_cpu_fallback_bytes_total")
                          for d in pair)
    assert moved["off"] - moved["bkcl"] >= 2 * 4 * 2 * (16 << 20), moved


def test_between_daemons_a_failing_bkcl_call_fails_both_ranks_within_the_timeout(
    start_daemon,
) -> None:
    # Rank 1's daemon cannot issue its part: rank 1 fails at once naming the
    # call; rank 0, whose part waits on the device for a peer that will
    # never come, is aborted at the group's timeout. Both groups are broken.
    daemons = [start(start_daemon), start(start_daemon, FAKE_BKCL_FAIL="all_reduce")]
    # The group's timeout also bounds the first call's join (a gloo exchange,
    # the Store, bkcl_init_rank): long enough for a loaded machine.
    results = launch(daemons[0], "library_failure", FLAGOS_TEST_PG_TIMEOUT_S="8",
                     **between(daemons))
    lines = []
    for code, out, err in results:
        assert code == 0, out + err[-6000:]
        lines.append(reports(out, "library_failure"))
    assert len(lines[0]) == 2 and len(lines[1]) == 2, lines
    assert re.search(r"BKCL \(.*\) between the daemons: its part did not complete within the "
                     r"group's timeout \(8000 ms\): a peer did not issue its part; the "
                     r"communicator was aborted; the process group is broken", lines[0][0]), lines
    assert re.search(r"BKCL \(.*\) between the daemons: .*bkcl_all_reduce failed: "
                     r"BKCL_RUNTIME_ERROR \(2\)", lines[1][0]), lines
    for rank_lines in lines:  # the broken group's next collective fails at once
        assert "the process group is broken" in rank_lines[1], lines
    for d in daemons:
        after = settled(d, quiet_between)
        assert after["flagosd_collective_between_daemons_failures_total"] == 2, after
        assert quiet_between(after), after


def test_two_ranks_on_one_device_are_refused_naming_them(start_daemon) -> None:
    daemon = start(start_daemon)
    for code, out, err in launch(daemon, "same_device", FLAGOS_TEST_DEVICE="0",
                                 FLAGOS_TEST_PG_TIMEOUT_S="60"):
        assert code == 0, out + err[-6000:]
        lines = reports(out, "same_device")
        assert len(lines) == 1 and re.search(
            r"ranks 0 and 1 are both on flagos:0, and BKCL \(.*\) runs one rank per device",
            lines[0]), out
    assert quiet(settled(daemon, quiet))


def test_a_bkcl_that_does_not_load_stops_flagosd_naming_it(flagosd_binary, tmp_path) -> None:
    not_bkcl = FAKE_XPU_ROOT / "so" / "libxpurt.so.2"  # loads, but has no bkcl_* functions
    missing = tmp_path / "libbkcl.so"
    for file, expected in ((not_bkcl, "lacks bkcl_get_unique_id"), (missing, "does not load")):
        done = subprocess.run(
            [str(flagosd_binary), f"--listen=unix://{tmp_path}/s.sock", "--backend=kunlunxin",
             "--metrics-listen="],
            env=dict(os.environ, **fake_xpu_env(), FLAGOS_KUNLUNXIN_BKCL=str(file)),
            capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, done.stderr
        assert str(file) in done.stderr and expected in done.stderr, done.stderr
        assert "FLAGOS_KUNLUNXIN_BKCL=off" in done.stderr, done.stderr
