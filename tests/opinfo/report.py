"""Turns sweep results into docs/reference/operator-support.md and a root-cause summary.

    python3 tests/opinfo/report.py --results build/opinfo/results.jsonl \
        --markdown docs/reference/operator-support.md --command "scripts/op-sweep" --max-samples 8

The markdown depends only on the results and the arguments (no timestamps,
no durations, stable order), so regenerating on the same commit gives the
same file. The root-cause summary goes to stdout.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import (  # noqa: E402
    BACKWARD,
    DIRECTIONS,
    FORWARD,
    PASS,
    SEVERITY,
    SKIPPED_ON_CPU,
    WRONG,
    PairResult,
    read_results,
)

REPO = Path(__file__).resolve().parents[2]
MARKDOWN = Path("docs/reference/operator-support.md")
CELL_LIMIT = 160


# ------------------------------------------------------------------ provenance


def git_commit(exclude: Sequence[Path] = ()) -> str:
    """`git rev-parse --short HEAD`, with "+dirty" when the tree has changes (other than `exclude`)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout.strip()
        pathspec = ["--", "."] + [f":(exclude){p}" for p in exclude]
        status = subprocess.run(["git", "status", "--porcelain", *pathspec], cwd=REPO, check=True,
                                capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if status else "")


def torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ------------------------------------------------------------------ root causes


_NORMALISERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^sample \d+: "), ""),
    (re.compile(r"\[[^\[\]]*\]"), "[…]"),  # shapes, index lists
    (re.compile(r"\([\d, ]*\)"), "(…)"),  # index tuples, sizes
    (re.compile(r"'[^']*'"), "'…'"),  # quoted names
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"(?<![\w.])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?%?"), "N"),
    (re.compile(r"(nan|inf)\b"), "N"),
)


def root_cause(message: str) -> str:
    """A message with its sample index, numbers, shapes and names made generic."""
    text = message
    for pattern, replacement in _NORMALISERS:
        text = pattern.sub(replacement, text)
    return text.strip()[:200]


_VALUES_DIFFER = re.compile(r"Mismatched elements|^Expected .* but got |Scalars are not (close|equal)")


def cause_of(r: PairResult) -> str:
    """The group of a row: its normalised message; value mismatches by direction and dtype instead
    (their numbers say nothing about the cause)."""
    message = re.sub(r"^sample \d+: ", "", r.message)
    if r.verdict == WRONG and _VALUES_DIFFER.search(message):
        return f"values differ from the CPU ({r.direction}, {r.dtype})"
    return root_cause(message)


def root_causes(results: Sequence[PairResult]) -> list[tuple[str, str, list[PairResult]]]:
    """(verdict, cause, rows) for every non-PASS, non-skipped row, largest group first."""
    groups: dict[tuple[str, str], list[PairResult]] = defaultdict(list)
    for r in results:
        if r.verdict not in (PASS, SKIPPED_ON_CPU):
            groups[(r.verdict, cause_of(r))].append(r)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), SEVERITY.index(kv[0][0]), kv[0][1]))
    return [(verdict, cause, rows) for (verdict, cause), rows in ordered]


def print_root_causes(results: Sequence[PairResult], examples: int = 4) -> None:
    groups = root_causes(results)
    print(f"== {len(groups)} root causes (verdict, rows, distinct entries: normalised message)")
    for verdict, cause, rows in groups:
        entries = sorted({r.entry for r in rows})
        shown = ", ".join(entries[:examples]) + (f", … (+{len(entries) - examples})" if len(entries) > examples else "")
        print(f"{verdict:8} {len(rows):5} rows {len(entries):4} entries: {cause}")
        print(f"{'':8} e.g. {shown}")


# ------------------------------------------------------------------ markdown


def cell(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > CELL_LIMIT:
        text = text[: CELL_LIMIT - 1] + "…"
    return text.replace("\\", "\\\\").replace("|", "\\|")


def rate(counts: Counter[str]) -> str:
    considered = sum(n for verdict, n in counts.items() if verdict != SKIPPED_ON_CPU)
    if not considered:
        return "n/a"
    return f"{100.0 * counts[PASS] / considered:.1f}% ({counts[PASS]} / {considered})"


def totals_table(rows: Sequence[PairResult]) -> list[str]:
    """The verdict counts per direction and the pass rates, as markdown lines."""
    counts = {d: Counter(r.verdict for r in rows if r.direction == d) for d in DIRECTIONS}
    out = ["| verdict | " + " | ".join(DIRECTIONS) + " |",
           "| --- | " + " | ".join("---:" for _ in DIRECTIONS) + " |"]
    for verdict in SEVERITY:
        out.append(f"| {verdict} | " + " | ".join(str(counts[d][verdict]) for d in DIRECTIONS) + " |")
    out.append("| all | " + " | ".join(str(sum(counts[d].values())) for d in DIRECTIONS) + " |")
    out.append("| **pass rate** | " + " | ".join(rate(counts[d]) for d in DIRECTIONS) + " |")
    return out


def markdown(results: Sequence[PairResult], *, command: str, max_samples: int, timeout: float,
             commit: str, torch: str) -> str:
    results = sorted(results, key=PairResult.sort_key)
    entries = sorted({r.entry for r in results})
    cuda_extra = [r for r in results if r.reference]
    results = [r for r in results if not r.reference]
    failing = [r for r in results if r.verdict not in (PASS, SKIPPED_ON_CPU)]
    skipped = [r for r in results if r.verdict == SKIPPED_ON_CPU]

    out: list[str] = []
    w = out.append
    w("# Operator support on flagos (OpInfo sweep)")
    w("")
    w("Generated by `tests/opinfo` — do not edit by hand. Every OpInfo entry of PyTorch's")
    w("`op_db` (and the foreach databases) runs at every dtype it supports on the CPU among")
    w("float32, float64, float16, bfloat16, int64, int32, bool and complex64, on the CPU and on")
    w("flagos (CPU backend), and the outputs (forward) and the gradients of a weighted sum of the")
    w("outputs (backward, autograd dtypes) are compared. See `tests/opinfo/README.md`. The dtypes")
    w("an entry supports on CUDA only run too, against a CPU reference in a wider dtype, and are")
    w("reported in their own section (CUDA's extra dtypes).")
    w("")
    w("| | |")
    w("| --- | --- |")
    w(f"| command | `{command}` |")
    w(f"| commit | `{commit}` |")
    w(f"| torch | `{torch}` |")
    w(f"| samples | at most the first {max_samples} sample inputs per (entry, dtype) |")
    w(f"| time limit | {timeout:g} s per (entry, dtype) |")
    w(f"| entries | {len(entries)} |")
    w("")
    w("## Totals")
    w("")
    w("Pass rate: PASS / every (entry, dtype) the CPU itself can run (all but SKIPPED_ON_CPU).")
    w("")
    out.extend(totals_table(results))
    w("")
    w("Verdicts: PASS (every sample matched); WRONG (flagos ran, values differ: the first")
    w("mismatch); ERROR (flagos raised: exception and first line); CRASH (the worker process or")
    w("flagosd died); TIMEOUT (no result within the time limit); BLOCKED (backward only: the")
    w("forward failed on flagos, so gradients were not compared); SKIPPED_ON_CPU (the CPU raised")
    w("for every sample). Random and uninitialised-memory entries are compared by shapes and")
    w("dtypes only.")
    w("")
    w(f"## Not passing ({len(failing)})")
    w("")
    w("| entry | dtype | direction | verdict | message |")
    w("| --- | --- | --- | --- | --- |")
    for r in failing:
        w(f"| `{r.entry}` | {r.dtype} | {r.direction} | {r.verdict} | {cell(r.message)} |")
    w("")
    w(f"## Skipped on the CPU ({len(skipped)})")
    w("")
    w("The CPU reference raised for every sample (or the entry has none at that dtype).")
    w("")
    w("| entry | dtype | direction | CPU message |")
    w("| --- | --- | --- | --- |")
    for r in skipped:
        w(f"| `{r.entry}` | {r.dtype} | {r.direction} | {cell(r.message)} |")
    w("")
    w(f"## CUDA's extra dtypes ({len(cuda_extra)})")
    w("")
    w("The dtypes an entry supports on CUDA but not on the CPU (OpInfo's `supported_dtypes(\"cuda\")`")
    w("minus `supported_dtypes(\"cpu\")`, among the sweep's): libraries take their CUDA path on")
    w("flagos, so it must accept them. flagos runs them at the row's dtype (where ATen's CPU kernel")
    w("lacks it, in a wider dtype: [dtype-widening.md](dtype-widening.md)); the CPU reference runs")
    w("the sample's tensors of that dtype in the wider `reference` dtype and its outputs and")
    w("gradients are converted back, with the entry's CUDA tolerances. Not in the totals above.")
    w("")
    out.extend(totals_table(cuda_extra))
    w("")
    w("| entry | dtype | reference | direction | verdict | message |")
    w("| --- | --- | --- | --- | --- | --- |")
    for r in cuda_extra:
        w(f"| `{r.entry}` | {r.dtype} | {r.reference} | {r.direction} | {r.verdict} | {cell(r.message)} |")
    w("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path)
    parser.add_argument("--markdown", type=Path, help="write the markdown page here")
    parser.add_argument("--command", default="scripts/op-sweep", help="the command named in the page")
    parser.add_argument("--max-samples", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--commit", help="the commit the results are of (default: the tree's now)")
    parser.add_argument("--print-commit", action="store_true",
                        help="print the tree's commit (with +dirty) and exit: to take it before a sweep")
    args = parser.parse_args()
    if args.print_commit:
        print(git_commit(exclude=[MARKDOWN]))
        return

    if args.results is None:
        parser.error("--results is required")
    results = list(read_results(args.results))
    if args.markdown:
        text = markdown(results, command=args.command, max_samples=args.max_samples, timeout=args.timeout,
                        commit=args.commit or git_commit(exclude=[MARKDOWN]), torch=torch_version())
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
        print(f"wrote {args.markdown}")
    for label, rows in (("", [r for r in results if not r.reference]),
                        ("CUDA's extra dtypes, ", [r for r in results if r.reference])):
        for d in (FORWARD, BACKWARD):
            counts = Counter(r.verdict for r in rows if r.direction == d)
            summary = ", ".join(f"{v} {counts[v]}" for v in SEVERITY if counts[v])
            print(f"{label}{d}: pass rate {rate(counts)}; {summary}")
    print_root_causes(results)


if __name__ == "__main__":
    main()
