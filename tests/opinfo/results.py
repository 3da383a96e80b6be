"""The sweeps' data model: one verdict per (entry, dtype, mode, direction).

Entries are OpInfo entries (the operator sweep; mode "") or ModuleInfo
entries (the module sweep; mode "train" or "eval").

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
NEEDS_CUDA = "NEEDS_CUDA"  # flagos raised because the entry uses a feature only CUDA has

# Worst first: the verdict of a pair is the worst of its samples' verdicts.
SEVERITY: tuple[str, ...] = (CRASH, TIMEOUT, ERROR, NEEDS_CUDA, WRONG, BLOCKED, PASS, SKIPPED_ON_CPU)

FORWARD = "forward"
BACKWARD = "backward"
DIRECTIONS: tuple[str, ...] = (FORWARD, BACKWARD)

# The module sweep's modes (module.train(), module.eval()), in report order.
TRAIN = "train"
EVAL = "eval"
MIXED_DTYPE = "mixed-dtype"
INPUT_DTYPE = "input-dtype"
CPU_SCALAR = "cpu-scalar"
CONSTRUCTOR_DTYPE = "constructor-dtype"
CPU_BUFFERS = "cpu-buffers"
# Every suite's modes, in report order: operators have none, modules train and
# eval, the mixed-operand sweep its variants.
MODES: tuple[str, ...] = ("", TRAIN, EVAL, MIXED_DTYPE, INPUT_DTYPE, CONSTRUCTOR_DTYPE, CPU_SCALAR, CPU_BUFFERS)

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
    """One row of a sweep: entry is OpInfo `name` or `name.variant_test_name`, or a ModuleInfo name.

    `reference` (operators) is empty for the dtypes the entry supports on the
    CPU (the CPU reference runs at the row's dtype); for CUDA's extra dtypes
    (OpInfo's supported_dtypes("cuda") minus supported_dtypes("cpu")) it
    names the wider dtype the CPU reference was computed in.
    """

    entry: str
    dtype: str
    direction: str
    verdict: str
    message: str = ""
    mode: str = ""  # modules: "train" or "eval"
    reference: str = ""  # operators, CUDA's extra dtypes: the wider dtype of the CPU reference

    def sort_key(self) -> tuple[str, int, int, int]:
        return (self.entry, SWEEP_DTYPES.index(self.dtype) if self.dtype in SWEEP_DTYPES else 99,
                MODES.index(self.mode), DIRECTIONS.index(self.direction))

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


def not_passing(rows: Iterable[PairResult]) -> list[PairResult]:
    """The rows that are neither PASS nor SKIPPED_ON_CPU."""
    return [r for r in rows if r.verdict not in (PASS, SKIPPED_ON_CPU)]


def format_rows(rows: Iterable[PairResult]) -> str:
    """One indented line per row: dtype, mode (if any), reference (if any), direction, verdict, message."""
    return "\n".join(
        f"  {r.dtype}{' ' + r.mode if r.mode else ''}{' (reference ' + r.reference + ')' if r.reference else ''}"
        f" {r.direction}: {r.verdict}: {r.message}" for r in rows
    )
