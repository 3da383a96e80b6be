"""Runs every flagos benchmark against one daemon and reports ratios to baselines.

`scripts/bench` builds, starts a private flagosd, sets FLAGOS_ENDPOINT and
runs this. Each benchmark measures its flagos figure and its baseline in the
same run (see the module docstrings: tiny_op, roundtrip, copies, training,
multiproc, allreduce, tcp, kunlunxin_native, graphs; the shared timing code is in common.py). Prints a table and, for
a full run, writes it with the machine's description and the goals to
docs/performance.md.

Exit status: 0 when every benchmark ran (goals met or not), 1 when one failed
(including flagos results that disagree with the CPU).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
import traceback
from pathlib import Path

import common  # first: puts the source tree's plugin/ on sys.path if needed
import allreduce
import copies
import graphs
import kunlunxin_native
import multiproc
import roundtrip
import repeated_calls
import tcp
import tiny_op
import training
import torch_fl
from common import Context, Row

BENCHMARKS = {
    "tiny_op": tiny_op,
    "roundtrip": roundtrip,
    "copies": copies,
    "training": training,
    "multiproc": multiproc,
    "allreduce": allreduce,
    "tcp": tcp,
    "kunlunxin_native": kunlunxin_native,
    "graphs": graphs,
    "repeated_calls": repeated_calls,
}
# More than this fraction of the CPUs busy with other work makes figures unreliable.
BUSY_WARNING = 0.15
# The whole run takes 3-6 minutes; past this, something hangs.
WATCHDOG_S = 900
DEFAULT_OUTPUT = common.REPO / "docs" / "performance.md"
# The file's last section is written by hand from scripts/instructions-per-op
# (callgrind counts, not times): a run keeps it as it finds it.
KEPT_SECTION = "## Instructions per op (callgrind)"

# The goals of the performance work (the figures come from the modules, so
# that the text and the verdicts cannot drift apart).
GOALS = [
    ("1. async tiny op", f"`a.add_(b)` on 16 floats, including the final synchronize, "
                         f"≤ {tiny_op.GOAL:g}× native CPU"),
    ("2. sync round trip", f"`.item()` of a ready tensor ≤ {roundtrip.GOAL:g}× a raw "
                           f"Unix-socket ping-pong"),
    ("3. host↔device copies", f"copies of ≥ {copies.GOAL_MIN_BYTES >> 20} MiB, both directions, "
                              f"≥ {copies.GOAL:g}× a single-thread memcpy"),
    ("4. training step", f"MLP step ≤ {training.MLP_GOAL:g}× CPU; transformer block step "
                         f"≤ {training.TRANSFORMER_GOAL:g}× CPU"),
    ("5. tiny-op throughput", "no goal; reported to show how the daemon scales with clients"),
    ("6. allreduce", f"2 ranks on one daemon: bus bandwidth at "
                     f"{allreduce.GOAL_BANDWIDTH_BYTES >> 20} MiB ≥ {allreduce.GOAL_BANDWIDTH:g}× "
                     f"memcpy; at 1 KiB ≤ {allreduce.GOAL_LATENCY:g}× a gloo allreduce of CPU "
                     f"tensors between the same processes"),
    ("7. TCP on loopback", f"a TCP session's `.item()` ≤ {tcp.ITEM_GOAL:g}× a raw TCP ping-pong; "
                           f"its copies of {tcp.SIZES_MIB[0]} and {tcp.SIZES_MIB[1]} MiB ≥ "
                           f"{tcp.BULK_GOAL:g}× raw TCP throughput"),
    ("8. kunlunxin native route", f"an MLP + Adam step on kunlunxin (over the fakes in CI): "
                                  f"≥ {kunlunxin_native.NATIVE_SHARE_GOAL:.0%} of its ops native, "
                                  f"≤ {kunlunxin_native.BYTES_GOAL:.0%} of the all-cpu_fallback "
                                  f"bytes moved"),
    ("9. captured training step", f"an MLP step bound by tiny ops (4×64, batch {graphs.BATCH}), "
                                  f"captured once and replayed, ≤ {graphs.GOAL:g}× the same step "
                                  f"run eagerly by native CPU torch, with equal losses"),
    ("10. repeated op calls", "no goal; eager loops with and without --reuse-op-calls, and the "
                              "share of their op calls that ran prepared"),
]


def _method() -> str:
    """The benchmark modules' docstrings, as markdown paragraphs and lists."""
    parts = []
    for module in BENCHMARKS.values():
        doc = (module.__doc__ or "").split("\nWorker mode")[0].strip()
        paragraphs = [p for p in doc.split("\n\n") if p.strip()]
        for i, paragraph in enumerate(paragraphs):
            lines = paragraph.splitlines()
            if lines[0].startswith("- "):
                items: list[str] = []
                for line in lines:
                    if line.startswith("- "):
                        items.append(line)
                    else:
                        items[-1] += " " + line.strip()
                parts.append("\n".join(items))
            else:
                text = " ".join(l.strip() for l in lines)
                parts.append(f"**{text}**" if i == 0 else text)
    return "\n\n".join(parts)


def write_markdown(path: Path, rows: list[Row], info: list[tuple[str, str]], command: str,
                   elapsed_s: float, quick: bool) -> None:
    lines = [
        "# flagos performance",
        "",
        "<!-- Generated by scripts/bench (bench/run.py); do not edit: rerun it "
        "(the last section, from scripts/instructions-per-op, is kept). -->",
        f"*Generated by `{command}` — do not edit by hand; rerun it to refresh.*"
        + (" **Quick run: fewer repetitions and sizes.**" if quick else ""),
        "",
        "Every flagos figure is measured beside its baseline in the same run, on",
        "the same machine, against a private flagosd (CPU backend) that the run",
        "starts and stops. Times are medians over repetitions after a warm-up;",
        "ratio = flagos ÷ baseline (for times lower is better, for rates higher).",
        "",
        "## Where and when",
        "",
        "| | |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in info]
    lines += [
        f"| run time | {elapsed_s:.0f} s of benchmarks |",
        "",
        "## Results",
        "",
        common.markdown_table(rows),
        "",
    ]
    notes = [f"- {r.section}, {r.name}: {r.note}" for r in rows if r.note]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    lines += ["## Goals", "", "The goals of the performance work, and whether this run met them:", ""]
    lines += [f"- {section}: {text}" for section, text in GOALS]
    lines += ["", "| benchmark | goal | ratio | met |", "| --- | --- | ---: | --- |"]
    for row in rows:
        if row.goal is not None:
            lines.append(f"| {row.section}: {row.name} | {row.goal_text()} | "
                         f"{common.fmt_ratio(row.ratio)} | {'yes' if row.met else '**no**'} |")
    met = sum(1 for r in rows if r.met)
    total = sum(1 for r in rows if r.goal is not None)
    lines += ["", f"{met} of {total} goals met.", "", "## Method", "", _method(), ""]
    old = path.read_text() if path.exists() else ""
    if KEPT_SECTION in old:
        lines.append(old[old.index(KEPT_SECTION):].rstrip("\n") + "\n")
    path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions and sizes (a smoke run); writes no file unless --output")
    parser.add_argument("--only", default="",
                        help=f"comma-separated subset of {','.join(BENCHMARKS)}; writes no file unless --output")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"markdown file to write (default for a full run: {DEFAULT_OUTPUT})")
    parser.add_argument("--no-output", action="store_true", help="print only, write no file")
    parser.add_argument("--command", default="scripts/bench",
                        help="the command line to name in the generated file")
    parser.add_argument("--load-at-start", default="",
                        help="load average when the command started (before building)")
    args = parser.parse_args()

    names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}")
    output = args.output
    if output is None and not args.no_output and not args.quick and not args.only:
        output = DEFAULT_OUTPUT
    if args.no_output:
        output = None

    if not os.environ.get("FLAGOS_ENDPOINT"):
        print("bench: FLAGOS_ENDPOINT is not set; run scripts/bench", file=sys.stderr)
        return 2

    load_now = common.load_average()
    busy_before = common.cpu_busy(1.0)
    # Asked without opening a session: this process's session opens with the
    # first benchmark that uses the device.
    daemon = torch_fl.daemon_stats(os.environ["FLAGOS_ENDPOINT"])
    devices = daemon.get("devices", [])
    info = [
        ("date", common.utc_now()),
        ("command", f"`{args.command}`"),
        ("git commit", common.git_commit()),
        *common.machine(),
        ("flagosd", f"{torch_fl.__version__}, backend {daemon.get('backend', '?')}, "
                    f"{len(devices)} devices, a private daemon started by the run"),
        ("load average (1/5/15 min)",
         (f"{args.load_at_start} when the command started, " if args.load_at_start else "")
         + f"{load_now} when the benchmarks started"),
        ("CPUs busy just before", f"{busy_before:.0%} (1 s sample, the daemon idle)"),
    ]
    print("bench: machine")
    for key, value in info:
        print(f"  {key + ':':<27} {value.replace('`', '')}")

    if busy_before > BUSY_WARNING:
        print(f"bench: WARNING: the CPUs were {busy_before:.0%} busy before the run started: "
              "other work skews these figures", file=sys.stderr)

    # A benchmark that hangs (a lost reply from the daemon) ends the run with
    # every thread's Python stack, instead of waiting for ever.
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    other = common.OtherLoad()
    ctx = Context(quick=args.quick)
    rows: list[Row] = []
    failed: list[str] = []
    start = time.perf_counter()
    for name in names:
        module = BENCHMARKS[name]
        print(f"bench: {name}: {(module.__doc__ or '').splitlines()[0]}", flush=True)
        t0 = time.perf_counter()
        try:
            rows += module.run(ctx)
        except Exception:  # report, go on with the others, fail at the end
            traceback.print_exc()
            failed.append(name)
        print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    elapsed = time.perf_counter() - start
    faulthandler.cancel_dump_traceback_later()
    # Other work on the machine skews the figures: say how busy it was.
    info = [(k, v + f", {common.load_average()} when they ended" if k.startswith("load") else v)
            for k, v in info]
    others = other.fraction()
    info.append(("CPUs taken by other work", f"about {others:.0%} during the benchmarks"
                 + (" — **the figures are skewed**" if others > BUSY_WARNING else "")))

    print()
    print(common.text_table(rows))
    for row in rows:
        if row.note:
            print(f"note: {row.section}, {row.name}: {row.note}")
    met = sum(1 for r in rows if r.met)
    total = sum(1 for r in rows if r.goal is not None)
    print(f"\n{met} of {total} goals met; benchmarks took {elapsed:.0f} s; other work took "
          f"about {others:.0%} of the CPUs meanwhile")
    if others > BUSY_WARNING:
        print("bench: WARNING: other processes competed for the CPUs: rerun on a quiet machine "
              "for figures to compare", file=sys.stderr)

    if failed:
        print(f"bench: FAILED: {', '.join(failed)}; {output or 'no file'} not written",
              file=sys.stderr)
        return 1
    if output is not None:
        write_markdown(output, rows, info, args.command, elapsed, args.quick)
        print(f"bench: wrote {output}")
    return 0


if __name__ == "__main__":
    code = main()
    # torch_fl synchronizes and closes its session at exit; bound that too.
    faulthandler.dump_traceback_later(60, exit=True)
    sys.exit(code)
