"""Finds the first ATen operator whose flagos result differs from the CPU's.

    python3 tests/opinfo/localize.py ENTRY DTYPE [--sample N] [--backward]
    python3 tests/opinfo/localize.py --suite modules ENTRY DTYPE --mode train|eval [--sample N] [--backward]

For a WRONG row of a sweep: reruns sample N of the OpInfo (or ModuleInfo) entry on flagos
under a TorchDispatchMode that also runs every ATen call on CPU copies of its
arguments and compares the two results, then prints each call that differs
(the first one is usually the culprit; later ones inherit its error). When
no call differs, the two devices ran different calls: the diff of the ATen
call sequences on the CPU and on flagos shows where flagos decomposes an
operator that the CPU runs as one kernel. Needs FLAGOS_ENDPOINT (or starts a
private daemon, see docs/usage.md).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

import compare  # noqa: E402
from worker import SUITES  # noqa: E402


def _cpu(v: Any) -> Any:
    return v.detach().cpu() if isinstance(v, torch.Tensor) and v.device.type == compare.DEVICE else v


def _device(v: Any) -> Any:
    if isinstance(v, torch.device) and v.type == compare.DEVICE:
        return torch.device("cpu")
    return v


def _not_comparable(func: Any) -> bool:
    """Calls whose results are random or uninitialised."""
    return torch.Tag.nondeterministic_seeded in func.tags or "empty" in func.__name__


class LogOps(TorchDispatchMode):
    """Records the ATen calls made under it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


class CompareEachOp(TorchDispatchMode):
    """Runs each ATen call on flagos and on CPU copies of its arguments; records the calls that differ."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.names: list[str] = []
        self.skipped = 0
        self.differences: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        cpu_args = tree_map(lambda v: _device(_cpu(v)), (args, kwargs))
        out = func(*args, **kwargs)
        self.calls += 1
        self.names.append(str(func))
        if _not_comparable(func):
            return out
        flagos_inputs = [v for v in tree_flatten((args, kwargs))[0] if isinstance(v, torch.Tensor)]
        outputs = [v for v in tree_flatten(out)[0] if isinstance(v, torch.Tensor)]
        if not any(t.device.type == compare.DEVICE for t in flagos_inputs + outputs):
            return out  # a CPU-only call (e.g. making the backward's weights)
        if any(t.is_conj() or t.is_neg() for t in flagos_inputs + outputs):
            # Lazy conj/neg bits: copying them under this mode is not reliable; not compared.
            self.skipped += 1
            return out
        try:
            expected = func(*cpu_args[0], **cpu_args[1])
        except Exception as e:  # the CPU refuses these arguments: report, go on
            self.differences.append(f"#{self.calls} {func}: the CPU raised {compare.describe(e)}")
            return out
        diff = compare.mismatch(compare.to_cpu(out), compare.to_cpu(expected), random=False, tol=None)
        if diff:
            shapes = [(tuple(t.shape), str(t.dtype), t.stride()) for t in flagos_inputs]
            self.differences.append(f"#{self.calls} {func} inputs {shapes}: {diff}")
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="ops")
    parser.add_argument("entry")
    parser.add_argument("dtype")
    parser.add_argument("--mode", default="", help="modules: train or eval")
    parser.add_argument("--sample", type=int, default=0)
    parser.add_argument("--backward", action="store_true", help="also trace the backward")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    suite = importlib.import_module(SUITES[args.suite])
    entry = suite.all_entries()[args.entry]
    units = {(p.dtype, p.mode): p for p in suite.plan(entry)}
    unit = units.get((args.dtype, args.mode))
    if unit is None:
        sys.exit(f"{args.entry} has no unit {args.dtype} {args.mode!r}; it has: {sorted(units)}")
    sample = suite.samples(entry, unit, args.sample + 1)[args.sample]

    def run(device: str, mode: TorchDispatchMode) -> None:
        with mode:
            side = sample.run(device)
            if args.backward and unit.backward:
                side.gradients()

    on_cpu, on_flagos = LogOps(), CompareEachOp()
    run("cpu", on_cpu)
    run(compare.DEVICE, on_flagos)
    print(f"{on_flagos.calls} ATen calls, {len(on_flagos.differences)} differ from the CPU, "
          f"{on_flagos.skipped} not compared (conj/neg views)")
    for line in on_flagos.differences:
        print(line)
    if on_cpu.names != on_flagos.names:
        print("The ATen calls differ (- CPU, + flagos):")
        for line in difflib.unified_diff(on_cpu.names, on_flagos.names, lineterm="", n=1):
            if not line.startswith(("---", "+++")):
                print(line)


if __name__ == "__main__":
    main()
