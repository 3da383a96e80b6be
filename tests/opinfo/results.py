"""The sweep's data model: one verdict per (OpInfo entry, dtype, direction).

Torch-free, so that the driver and the report can use it without importing
torch. Results travel between processes and files as JSON lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

PASS = "PASS"
WRONG = "WRONG"  # flagos ran, its values differ from the CPU's
ERROR = "ERROR"  # flagos raised
CRASH = "CRASH"  # the worker process or flagosd died
TIMEOUT = "TIMEOUT"  # the (entry, dtype) hung past its limit
SKIPPED_ON_CPU = "SKIPPED_ON_CPU"  # the CPU reference raised for every sample (or had none)
BLOCKED = "BLOCKED"  # backward only: not run because the forward failed on flagos

# Worst first: the verdict of a pair is the worst of its samples' verdicts.
SEVERITY: tuple[str, ...] = (CRASH, TIMEOUT, ERROR, WRONG, BLOCKED, PASS, SKIPPED_ON_CPU)

FORWARD = "forward"
BACKWARD = "backward"
DIRECTIONS: tuple[str, ...] = (FORWARD, BACKWARD)

# The dtypes the sweep tries, in report order.
SWEEP_DTYPES: tuple[str, ...] = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "bool",
    "complex64",
)


# CUDA's extra dtypes: the wider dtype the CPU reference is computed in.
WIDER_REFERENCE: dict[str, str] = {
    "float32": "float64",
    "float64": "float64",
    "float16": "float32",
    "bfloat16": "float32",
    "int64": "float64",
    "int32": "float64",
    "bool": "uint8",
    "complex64": "complex128",
}


def severity(verdict: str) -> int:
    """Smaller is worse."""
    return SEVERITY.index(verdict)


@dataclass(frozen=True)
class Outcome:
    """The verdict of one direction of one (entry, dtype), with its first relevant message."""

    verdict: str
    message: str = ""


@dataclass(frozen=True)
class PairResult:
    """One row of the sweep: entry is OpInfo `name` or `name.variant_test_name`.

    `reference` is empty for the dtypes the entry supports on the CPU (the
    CPU reference runs at the row's dtype); for CUDA's extra dtypes (OpInfo's
    supported_dtypes("cuda") minus supported_dtypes("cpu")) it names the
    wider dtype the CPU reference was computed in.
    """

    entry: str
    dtype: str
    direction: str
    verdict: str
    message: str = ""
    reference: str = ""

    def sort_key(self) -> tuple[str, int, int]:
        return (self.entry, SWEEP_DTYPES.index(self.dtype) if self.dtype in SWEEP_DTYPES else 99,
                DIRECTIONS.index(self.direction))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> "PairResult":
        return PairResult(**json.loads(line))


def write_results(path: Path, results: Iterable[PairResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in sorted(results, key=PairResult.sort_key):
            f.write(r.to_json() + "\n")


def read_results(path: Path) -> Iterator[PairResult]:
    with open(path) as f:
        for line in f:
            if line.strip():
                yield PairResult.from_json(line)


def entry_key(name: str, variant: str) -> str:
    """The stable name of an OpInfo entry."""
    return f"{name}.{variant}" if variant else name
