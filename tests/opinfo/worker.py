"""The sweeps' child process: runs entries of one suite on request, reports as JSON lines.

    python3 tests/opinfo/worker.py --result-fd N [--suite ops|modules|mixed]

The suite: "ops" (OpInfo entries, harness.py), "modules" (ModuleInfo
entries, module_harness.py) or "mixed" (OpInfo samples with operands of
mixed dtypes and devices, mixed_harness.py); each gives all_entries, plan, supported,
samples, DTYPES, SAMPLE_SOURCE and error_verdict, and compare.compare_samples
runs a unit's samples on both devices. Reads one JSON request per line on stdin and
writes JSON events to file descriptor N (stdout and stderr are left to torch,
which may print there):

    {"cmd": "list"}
        -> {"event": "entries", "entries": [key, ...]}
    {"cmd": "ping"}
        -> {"event": "pong"}   (after a tiny operator ran on every flagos device)
    {"cmd": "run", "entry": key, "units": [[dtype, mode], ...] | null, "max_samples": 8}
        -> {"event": "plan", "units": [[dtype, mode, backward, reference], ...], "supported": [name, ...]}
           (the units it will run: dtypes, and for modules modes "train"/"eval";
           the mode is "" for operators; reference "", or for operators'
           CUDA's extra dtypes the wider dtype of the CPU reference, after
           all the dtypes the entry supports on the CPU; supported: the CPU's)
           per unit: {"event": "begin", "dtype": name, "mode": mode}
                     {"event": "phase", "dtype": name, "mode": mode, "sample": i, "phase": "forward"|"backward"}
                     {"event": "forward", "dtype": name, "mode": mode, "outcome": [verdict, message]}
                     {"event": "backward", "dtype": name, "mode": mode, "outcome": [verdict, message]}
                         (only when gradients are compared in that unit)
           {"event": "done"}

FLAGOS_ENDPOINT names the daemon. The driver restarts this process when it
dies or hangs; nothing here guards against either.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))

import importlib  # noqa: E402
from types import ModuleType  # noqa: E402

import torch  # noqa: E402

from compare import compare_samples, tolerances  # noqa: E402
from results import Outcome  # noqa: E402

SUITES = {"ops": "harness", "modules": "module_harness", "mixed": "mixed_harness",
          "mixed-modules": "module_mixed_harness"}


class Events:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def send(self, event: str, **fields: Any) -> None:
        self.out.write(json.dumps({"event": event, **fields}) + "\n")
        self.out.flush()


def run(events: Events, suite: ModuleType, entries: dict[str, Any], request: dict[str, Any]) -> None:
    entry = entries[request["entry"]]
    wanted = request.get("units")
    units = [p for p in suite.plan(entry) if wanted is None or [p.dtype, p.mode] in wanted]
    events.send("plan", units=[[p.dtype, p.mode, p.backward, p.reference] for p in units],
                supported=suite.supported(entry))
    for p in units:
        where = {"dtype": p.dtype, "mode": p.mode}
        events.send("begin", **where)

        def progress(sample: int, phase: str, where: dict[str, str] = where) -> None:
            events.send("phase", **where, sample=sample, phase=phase)

        def on_forward(outcome: Outcome, where: dict[str, str] = where) -> None:
            events.send("forward", **where, outcome=[outcome.verdict, outcome.message])

        _, backward = compare_samples(
            lambda p=p: suite.samples(entry, p, request["max_samples"]), suite.SAMPLE_SOURCE, p.backward,
            tolerances(entry.decorators, suite.DTYPES[p.dtype], "cuda" if p.reference else "cpu"),
            progress, on_forward, suite.error_verdict)
        if backward is not None:
            events.send("backward", **where, outcome=[backward.verdict, backward.message])
    events.send("done")


def ping() -> None:
    for index in range(torch.flagos.device_count()):
        x = torch.ones(4, device=f"flagos:{index}")
        assert (x + 1).sum().item() == 8.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--suite", choices=sorted(SUITES), default="ops")
    args = parser.parse_args()
    events = Events(os.fdopen(args.result_fd, "w"))
    warnings.simplefilter("ignore")
    # torch's default thread count, like flagosd's: reductions then split the same way on both sides.
    suite = importlib.import_module(SUITES[args.suite])
    entries = suite.all_entries()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request["cmd"] == "list":
            events.send("entries", entries=list(entries))
        elif request["cmd"] == "ping":
            ping()
            events.send("pong")
        elif request["cmd"] == "run":
            run(events, suite, entries, request)
        else:
            raise ValueError(f"unknown request {request!r}")


if __name__ == "__main__":
    main()
