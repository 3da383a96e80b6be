"""The sweep's child process: runs OpInfo entries on request, reports as JSON lines.

    python3 tests/opinfo/worker.py --result-fd N

Reads one JSON request per line on stdin and writes JSON events to file
descriptor N (stdout and stderr are left to torch, which may print there):

    {"cmd": "list"}
        -> {"event": "entries", "entries": [key, ...]}
    {"cmd": "ping"}
        -> {"event": "pong"}   (after a tiny operator ran on every flagos device)
    {"cmd": "run", "entry": key, "dtypes": [name, ...] | null, "max_samples": 8}
        -> {"event": "plan", "dtypes": [[name, backward, reference], ...], "supported": [name, ...]}
           (the dtypes it will run: all the entry supports on the CPU, reference "",
           then CUDA's extra dtypes, reference the wider dtype of the CPU reference;
           supported: the CPU's)
           per dtype: {"event": "begin", "dtype": name}
                      {"event": "phase", "dtype": name, "sample": i, "phase": "forward"|"backward"}
                      {"event": "forward", "dtype": name, "outcome": [verdict, message]}
                      {"event": "backward", "dtype": name, "outcome": [verdict, message]}
                          (only when gradients are compared at that dtype)
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

import torch  # noqa: E402

import harness  # noqa: E402


class Events:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def send(self, event: str, **fields: Any) -> None:
        self.out.write(json.dumps({"event": event, **fields}) + "\n")
        self.out.flush()


def run(events: Events, entries: dict[str, Any], request: dict[str, Any]) -> None:
    op = entries[request["entry"]]
    wanted = request.get("dtypes")
    dtype_plan = [p for p in harness.plan(op) if wanted is None or p.dtype in wanted]
    supported = sorted(str(d).removeprefix("torch.") for d in op.supported_dtypes("cpu"))
    events.send("plan", dtypes=[[p.dtype, p.backward, p.reference] for p in dtype_plan], supported=supported)
    for p in dtype_plan:
        events.send("begin", dtype=p.dtype)

        def progress(sample: int, phase: str, dtype: str = p.dtype) -> None:
            events.send("phase", dtype=dtype, sample=sample, phase=phase)

        def on_forward(outcome: harness.Outcome, dtype: str = p.dtype) -> None:
            events.send("forward", dtype=dtype, outcome=[outcome.verdict, outcome.message])

        _, backward = harness.run_pair(op, p.dtype, p.backward, request["max_samples"], progress, on_forward,
                                       p.reference)
        if backward is not None:
            events.send("backward", dtype=p.dtype, outcome=[backward.verdict, backward.message])
    events.send("done")


def ping() -> None:
    for index in range(torch.flagos.device_count()):
        x = torch.ones(4, device=f"flagos:{index}")
        assert (x + 1).sum().item() == 8.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args()
    events = Events(os.fdopen(args.result_fd, "w"))
    warnings.simplefilter("ignore")
    # torch's default thread count, like flagosd's: reductions then split the same way on both sides.
    entries = harness.all_entries()
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
            run(events, entries, request)
        else:
            raise ValueError(f"unknown request {request!r}")


if __name__ == "__main__":
    main()
