"""torchrun on flagos (docs/usage.md, "Frameworks", "torchrun"): N
single-device processes without a process group work, and a gloo-only
process group does what the table of that section says. Process groups
with the flagos c10d backend are tests/python/test_distributed.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flagos_test_env import REPO

USAGE = REPO / "docs" / "usage.md"


def torchrun_example() -> str:
    match = re.search(r"<!-- torchrun-example -->\n```python\n(.*?)```", USAGE.read_text(), re.S)
    assert match, "docs/usage.md lost its torchrun-example block"
    return match.group(1)


def torchrun(script: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
         "--standalone", str(script), *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=script.parent,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def ranks_said(stdout: str, what: str) -> list[str]:
    """The ranks' reports "rank N <what>...", sorted. Two ranks write to one
    pipe, and a report may share a line with the other rank's (seen in CI
    runs: "...flagosrank 1 all_reduce: ..."), so reports end at the next
    report or the line's end."""
    return sorted(m.strip() for m in re.findall(rf"rank \d {re.escape(what)}.*?(?=rank \d |$)",
                                                stdout, re.M))


def test_the_example_runs_one_process_per_flagos_device(tmp_path: Path) -> None:
    script = tmp_path / "per_rank.py"
    script.write_text(torchrun_example())
    result = torchrun(script)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    lines = ranks_said(result.stdout, "of")
    # Each rank on its own device; (rank + 1) * 2 * 4 elements.
    assert lines == ["rank 0 of 2 on flagos:0: sum 8.0", "rank 1 of 2 on flagos:1: sum 16.0"]


PROCESS_GROUP = r"""
import os, sys
import torch
import torch.distributed as dist
import torch_fl  # noqa: F401

rank = int(os.environ["LOCAL_RANK"])
torch.flagos.set_device(rank)
what = sys.argv[1]
dist.init_process_group("gloo")
x = torch.full((4,), float(rank + 1), device="flagos")
if what == "flagos_tensor":
    try:
        dist.all_reduce(x)
        print(f"rank {rank} all_reduce: {x.cpu().tolist()}", flush=True)
    except RuntimeError as e:
        print(f"rank {rank} all_reduce: {e}", flush=True)
else:
    y = x.cpu()
    dist.all_reduce(y)
    x.copy_(y)
    print(f"rank {rank} all_reduce: {x.cpu().tolist()} on {x.device}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture
def process_group_script(tmp_path: Path) -> Path:
    script = tmp_path / "process_group.py"
    script.write_text(PROCESS_GROUP)
    return script


def rank_lines(result: subprocess.CompletedProcess[str], what: str) -> list[str]:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return ranks_said(result.stdout, f"{what}:")


def test_a_gloo_collective_on_a_flagos_tensor_is_refused(process_group_script: Path) -> None:
    lines = rank_lines(torchrun(process_group_script, "flagos_tensor"), "all_reduce")
    assert lines == [f"rank {r} all_reduce: No backend type associated with device type flagos"
                     for r in (0, 1)]


def test_a_gloo_collective_through_the_host_works(process_group_script: Path) -> None:
    lines = rank_lines(torchrun(process_group_script, "through_host"), "all_reduce")
    # 1 + 2 on each rank, back on its flagos device.
    assert lines == [f"rank {r} all_reduce: [3.0, 3.0, 3.0, 3.0] on flagos:{r}" for r in (0, 1)]
