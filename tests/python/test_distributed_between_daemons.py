"""torch.distributed on flagos tensors when the ranks use different daemons
(docs/distributed.md, "Several nodes"): each rank's flagosd joins the group
through gloo (torch's ProcessGroupGloo inside flagosd), and the collectives
run between the daemons over TCP, on the daemons' memory.

Two daemons of the run's backend on this machine, one per rank (a private
daemon per rank, as two nodes would each have theirs), over loopback. The
workload (tests/distributed/workload.py, FLAGOS_TEST_ENDPOINTS) is the one
test_distributed.py runs on a shared daemon: every collective and the
training cases against plain torch on the CPU, and the faults. On kunlunxin
the collectives BKCL takes run through it between the daemons (the fake
BKCL's ranks meet across processes: tests/fakes/bkcl/fake_bkcl_hub.h), the
others through gloo on the host route; the calls are compared through gloo
either way.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from flagos_test_env import on_kunlunxin
from test_distributed import (WORKLOAD, crash_and_restart, env_for, finish, free_port,
                              killed_rank_named, launch, metrics, ok, reports, serves_on, settled,
                              spawn, summed, torchrun)


# How a collective BKCL takes describes itself on kunlunxin (collective_ops
# and library_collectives name the route in the call's signature).
LIB = re.escape(" through the collective library") if on_kunlunxin() else ""


@pytest.fixture
def daemons(start_daemon):
    return [start_daemon(extra_args=["--metrics-listen=127.0.0.1:0"]) for _ in range(2)]


def endpoints(daemons) -> dict[str, str]:
    return {"FLAGOS_TEST_ENDPOINTS": ",".join(d.endpoint for d in daemons)}


def quiet(samples: dict[str, float]) -> bool:
    return (samples.get("flagosd_ranks_between_daemons", -1) == 0
            and samples.get("flagosd_communicators", -1) == 0
            and summed(samples, "flagosd_sessions") == 0)


def all_quiet(daemons) -> list[dict[str, float]]:
    after = [settled(d, quiet) for d in daemons]
    for samples in after:
        assert quiet(samples), samples  # no rank, communicator or session outlives the job
    return after


def test_every_collective_between_two_daemons_matches_its_arithmetic(daemons) -> None:
    ok(torchrun(daemons[0], "collectives", **endpoints(daemons)), "collectives")
    for samples in all_quiet(daemons):
        # Each daemon ran its own rank's part of every collective, through
        # gloo; none met in a daemon's own communicators.
        assert samples["flagosd_collectives_between_daemons_total"] >= 20, samples
        assert samples["flagosd_collective_between_daemons_bytes_total"] > 0, samples
        assert samples["flagosd_collective_between_daemons_failures_total"] == 0, samples
        assert samples["flagosd_collectives_total"] == 0, samples
        # On kunlunxin, BKCL carried what it takes (sum/product/min/max of its
        # dtypes, broadcasts, gathers, reduce-scatters, even all-to-alls),
        # gloo the rest.
        by_library = samples["flagosd_collectives_by_library_total"]
        between = samples["flagosd_collectives_between_daemons_total"]
        assert (12 <= by_library <= between - 8) if on_kunlunxin() else by_library == 0, samples


def threads(daemon) -> int:
    with open(f"/proc/{daemon.proc.pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def test_a_second_job_between_daemons_leaves_no_more_threads_than_the_first(daemons) -> None:
    # Each rank's gloo group has threads of its own; they end with the group
    # (the daemon's one gloo device, made by the first job, stays). After
    # each job the daemons' pools retire their spare threads.
    counts = []
    for _ in range(2):
        ok(torchrun(daemons[0], "collectives", **endpoints(daemons)), "collectives")
        all_quiet(daemons)
        counts.append([threads(d) for d in daemons])
    deadline = time.monotonic() + 30
    while any(t > first for t, first in zip((threads(d) for d in daemons), counts[0])):
        assert time.monotonic() < deadline, (counts, [threads(d) for d in daemons])
        time.sleep(0.2)


def test_no_tensor_byte_of_a_collective_between_daemons_passes_through_the_clients(
        daemons) -> None:
    before = [metrics(d) for d in daemons]
    ok(torchrun(daemons[0], "large", **endpoints(daemons)), "large")
    for b, a in zip(before, all_quiet(daemons)):
        given = (a["flagosd_collective_between_daemons_bytes_total"]
                 - b.get("flagosd_collective_between_daemons_bytes_total", 0))
        copied = summed(a, "flagosd_copy_bytes_total") - summed(b, "flagosd_copy_bytes_total")
        # This daemon's rank: 4 allreduces x 16 MiB (and a barrier's bytes).
        assert 4 * (16 << 20) <= given < 4 * (16 << 20) + 4096, a
        assert copied < 64 << 10, (copied, a)


@pytest.mark.parametrize("case", ["ddp_mlp", "ddp_syncbn", "fsdp2", "streams", "p2p",
                                  "dtensor", "dcp"])
def test_training_between_two_daemons_matches_one_process(daemons, case) -> None:
    ok(torchrun(daemons[0], case, **endpoints(daemons)), case)
    all_quiet(daemons)


def test_calls_that_differ_across_daemons_fail_on_every_rank_naming_both(daemons) -> None:
    result = torchrun(daemons[0], "mismatch", **endpoints(daemons))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    lines = reports(result.stdout, "mismatch")
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert re.search(rf"collective #0 on communicator \S+: rank 0 called all_reduce\(sum\) "
                         rf"Float\[4\]{LIB}, rank 1 called all_reduce\(sum\) Float\[5\]{LIB}: "
                         rf"every rank must call the same collectives", line), line
    for samples in all_quiet(daemons):
        assert samples["flagosd_collective_between_daemons_failures_total"] == 1, samples


def test_a_killed_rank_fails_its_peer_on_another_daemon_naming_it(daemons, run_python) -> None:
    # The timeout is long: the error must come from rank 1's session
    # closing in its daemon, not from the timeout.
    killed_rank_named(launch(daemons[0], "killed", FLAGOS_TEST_PG_TIMEOUT_S="600",
                             **endpoints(daemons)))
    all_quiet(daemons)
    for d in daemons:  # both daemons serve on
        serves_on(d, run_python)


def test_a_rank_that_never_joins_times_out(daemons) -> None:
    (code0, out0, err0), (code1, out1, err1) = launch(
        daemons[0], "late", FLAGOS_TEST_PG_TIMEOUT_S="3", **endpoints(daemons))
    assert code0 == 0 and code1 == 0, out0 + err0[-4000:] + out1 + err1[-4000:]
    lines = reports(out0, "late")
    assert len(lines) == 1 and re.search(
        rf"collective #0 on communicator \S+ \(all_reduce\(sum\) Float\[4\]{LIB}, between "
        rf"daemons\): gloo between the daemons: .*[Tt]imed out.*the process group is broken",
        lines[0]), out0
    all_quiet(daemons)


def test_a_restart_of_one_ranks_daemon_ends_the_group_on_both(daemons) -> None:
    # A short group timeout: on kunlunxin a BKCL part that waits for the
    # restarted daemon's rank runs it out.
    procs = spawn(daemons[0], "restarted", FLAGOS_TEST_PG_TIMEOUT_S="30", **endpoints(daemons))
    try:
        for p in procs:  # both ranks all_reduce in a loop
            line = p.stdout.readline()
            assert line.strip().endswith("restarted: running"), line + p.stderr.read()[-4000:]
        crash_and_restart(daemons[0])
    except BaseException:
        for p in procs:
            p.kill()
        raise
    (code0, out0, err0), (code1, out1, err1) = finish(procs)
    assert code0 == 0 and code1 == 0, out0 + err0[-4000:] + out1 + err1[-4000:]
    lost0 = [line for line in reports(out0, "restarted") if "running" not in line]
    lost1 = [line for line in reports(out1, "restarted") if "running" not in line]
    assert len(lost0) == 2 and len(lost1) == 2, (out0, out1)
    # Rank 0 lost its session: the loss error, then the group's end.
    lost = [line for line in lost0 if ": lost: " in line]
    ended = [line for line in lost0 if ": lost: " not in line]
    assert len(lost) == 1 and "was lost" in lost[0] and daemons[0].endpoint in lost[0], lost0
    assert len(ended) == 1 and "the process group ended with it; restart the job" in ended[0], lost0
    # Rank 1's daemon saw its peer's gloo connection go (or, on kunlunxin,
    # when the restart came while its BKCL part waited on the device, its
    # part ran out the group's timeout): its collective fails, and so does
    # the broken group's next one.
    for line in lost1:
        assert re.search(r"between daemons\): (gloo|BKCL \(.*\)) between the daemons: .*the "
                         r"process group is broken; restart the job", line), lost1
    all_quiet(daemons)


def test_two_torchrun_nodes_each_on_its_own_daemon_train_as_one_process(daemons) -> None:
    # As on two nodes (docs/distributed.md, "Several nodes"): a torchrun per
    # "node", --nnodes 2 with torchrun's c10d rendezvous, each node's rank
    # on that node's daemon; the workers' store is the agents' TCPStore.
    port = str(free_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--node-rank", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", "between-daemons", str(WORKLOAD), "ddp_mlp"],
        env=env_for(d), cwd=WORKLOAD.parent, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for n, d in enumerate(daemons)]
    results = finish(nodes)
    lines = []
    for code, out, err in results:
        assert code == 0, out[-3000:] + err[-6000:]
        lines += reports(out, "ddp_mlp")
    assert sorted(lines) == ["rank 0 ddp_mlp ok", "rank 1 ddp_mlp ok"], results
    for samples in all_quiet(daemons):
        assert samples["flagosd_collectives_between_daemons_total"] > 0, samples


RAW_JOINS = r'''
import sys, time, torch, torch_fl
import torch_fl.distributed  # the flagos_c10d schemas
ops = torch.ops.flagos_c10d
x = torch.ones(4, device="flagos")
closed_port = int(sys.argv[1])
calls = {
    # TEST-NET-3 (RFC 5737): no interface's network; refused before any
    # connection (the timeout is long: a connection attempt would hang).
    "far store": ("j-a", 0, 2, "203.0.113.7", 29500, 600.0),
    "not a host": ("j-b", 0, 2, "x;rm -rf /", 29500, 600.0),
    "long host": ("j-c", 0, 2, "a" * 300, 29500, 600.0),
    "port zero": ("j-d", 0, 2, "127.0.0.1", 0, 600.0),
    "port beyond": ("j-e", 0, 2, "127.0.0.1", 70000, 600.0),
    "huge group": ("j-f", 0, 2**31 - 1, "127.0.0.1", 29500, 600.0),
    "rank outside": ("j-g", 3, 2, "127.0.0.1", 29500, 600.0),
    # Allowed, but nothing listens there: fails within its timeout.
    "closed port": ("j-h", 0, 2, "127.0.0.1", closed_port, 2.0),
}
for name, args in calls.items():
    start = time.monotonic()
    try:
        ops.join_group(x, *args)
        torch.flagos.synchronize()
        print(name, "-> no error")
    except RuntimeError as e:
        print(name, "->", f"{time.monotonic() - start:.1f}s", str(e).splitlines()[0])
# The session goes on.
print("after ->", (x + 1).cpu().tolist())
'''


def raw_joins(daemon, run_python) -> dict[str, tuple[float, str]]:
    code = RAW_JOINS.replace("sys.argv[1]", str(free_port()))
    result = run_python(code, env={"FLAGOS_ENDPOINT": daemon.endpoint}, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = dict(line.split(" -> ", 1) for line in result.stdout.splitlines())
    assert lines.pop("after") == "[2.0, 2.0, 2.0, 2.0]", result.stdout
    out = {}
    for name, text in lines.items():
        assert text != "no error", (name, result.stdout)
        seconds, message = text.split("s ", 1)
        out[name] = (float(seconds), message)
    return out


def test_a_client_cannot_make_flagosd_connect_outside_its_store_networks(
    start_daemon, run_python
) -> None:
    # What a client that bypasses torch.distributed could send to join a
    # group that spans daemons: flagosd connects only to Stores in its
    # --store-networks (auto: loopback and this node's networks), checks the
    # rest, and the session goes on with nothing left behind.
    daemon = start_daemon(extra_args=["--metrics-listen=127.0.0.1:0"])
    lines = raw_joins(daemon, run_python)
    expected = {
        "far store": r"flagosd does not join it: flagosd connects only to Stores in its "
                     r"--store-networks, and '203\.0\.113\.7' \(203\.0\.113\.7\) is in none of "
                     r"them: auto \(loopback and this node's networks: 127\.0\.0\.0/8.*\); if the "
                     r"job's Store is there, the node's operator adds its network to flagosd's "
                     r"--store-networks \(e\.g\. --store-networks=auto,203\.0\.113\.7\)",
        "not a host": r"'x;rm -rf /' is not a host name or an IP address",
        "long host": r"'a{64}\.\.\.' is not a host name or an IP address",
        "port zero": r"store port 0 is not a TCP port",
        "port beyond": r"store port 70000 is not a TCP port",
        "huge group": r"a group of 2147483647 ranks; flagosd forms groups of 1 to 4096 ranks",
        "rank outside": r"rank 3 of 2 is not a rank of a group of that size",
        "closed port": r"flagosd could not reach the c10d Store at 127\.0\.0\.1:\d+ that the "
                       r"process group was formed on",
    }
    for name, pattern in expected.items():
        seconds, message = lines[name]
        assert re.search(pattern, message), (name, message)
        # None waited for a connection but the one that was allowed to try.
        assert seconds < (30 if name == "closed port" else 5), (name, seconds, message)
    after = settled(daemon, quiet)
    assert quiet(after), after


FORGED_PEERS = r'''
import datetime, socket, struct, sys, time, torch, torch_fl
import torch.distributed as dist
import torch_fl.distributed  # the flagos_c10d schemas
ops = torch.ops.flagos_c10d
x = torch.ones(4, device="flagos")
# The client's own Store, on loopback (allowed), where it writes rank 1's
# gloo record itself instead of a daemon: torch 2.13's gloo layout (host
# name, a 136-byte address: sockaddr_storage and a sequence, an i64 per rank).
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60))

def record(family, address, port):
    sa = struct.pack("<H", family) + struct.pack(">H", port) + (
        socket.inet_pton(socket.AF_INET, address) if family == socket.AF_INET
        else b"\0" * 4 + socket.inet_pton(socket.AF_INET6, address))
    sa += b"\0" * (128 - len(sa))
    host = b"elsewhere"
    return (struct.pack("<Q", len(host)) + host + struct.pack("<Q", 136) + sa
            + struct.pack("<q", -1) + struct.pack("<2q", 0, 1))

peers = {
    # TEST-NET-3 (RFC 5737) and a documentation IPv6 address: outside auto.
    "far peer": record(socket.AF_INET, "203.0.113.7", 4567),
    "far peer v6": record(socket.AF_INET6, "2001:db8::5", 4567),
    "unreadable peer": b"not a gloo record",
}
for n, (name, value) in enumerate(peers.items()):
    comm = f"forged-{n}"
    store.set(f"flagos/{comm}/gloo/0/1", value)
    start = time.monotonic()
    try:
        ops.join_group(x, comm, 0, 2, "127.0.0.1", store.port, 600.0)
        torch.flagos.synchronize()
        print(name, "-> no error")
    except RuntimeError as e:
        print(name, "->", f"{time.monotonic() - start:.1f}s", str(e).splitlines()[0])
print("after ->", (x + 1).cpu().tolist())
'''


def test_a_client_cannot_make_flagosd_connect_to_peers_outside_its_store_networks(
    start_daemon, run_python
) -> None:
    # The Store is allowed, but the peer addresses in it are the client's to
    # write: flagosd reads each peer's gloo record before its gloo may
    # connect there, and refuses addresses outside --store-networks and
    # records it cannot read, at once (the group's timeout is 600 s).
    daemon = start_daemon(extra_args=["--metrics-listen=127.0.0.1:0"])
    result = run_python(FORGED_PEERS, env={"FLAGOS_ENDPOINT": daemon.endpoint}, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = dict(line.split(" -> ", 1) for line in result.stdout.splitlines())
    assert lines.pop("after") == "[2.0, 2.0, 2.0, 2.0]", result.stdout
    expected = {
        "far peer": r"flagosd does not join it: rank 1 is at 203\.0\.113\.7:4567 \(the address "
                    r"its daemon published in the job's Store\), and flagosd connects only to "
                    r"addresses in its --store-networks: auto \(loopback and this node's "
                    r"networks: 127\.0\.0\.0/8.*\); if that daemon's node is there, the node's "
                    r"operator adds its network to flagosd's --store-networks \(e\.g\. "
                    r"--store-networks=auto,203\.0\.113\.7\)",
        "far peer v6": r"flagosd does not join it: rank 1 is at \[2001:db8::5\]:4567 ",
        "unreadable peer": r"flagosd does not join it: rank 1's daemon cannot be checked against "
                           r"--store-networks: its gloo record \(17 bytes\) is not in the layout "
                           r"flagosd reads \(torch 2\.13's gloo rank record: .*\): a host name of "
                           r"\d+ bytes",
    }
    assert set(lines) == set(expected), result.stdout
    for name, pattern in expected.items():
        seconds, message = lines[name].split("s ", 1)
        assert re.search(pattern, message), (name, message)
        assert float(seconds) < 5, (name, seconds, message)
    after = settled(daemon, quiet)
    assert quiet(after), after


def test_store_networks_none_refuses_every_group_between_daemons(
    start_daemon, run_python, flagosd_binary, tmp_path
) -> None:
    daemon = start_daemon(extra_args=["--store-networks=none"])
    seconds, message = raw_joins(daemon, run_python)["closed port"]
    assert "flagosd does not join it: this flagosd joins no process group that spans daemons " \
           "(--store-networks=none)" in message, message
    # A rule that is not one is refused at start, naming it.
    out = subprocess.run([str(flagosd_binary), f"--listen=unix://{tmp_path}/s.sock",
                          "--backend=cpu", "--metrics-listen=", "--store-networks=auto,10.0.0.0/33"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--store-networks: '10.0.0.0/33' is not an IP address or a network" in out.stderr, \
        out.stderr
