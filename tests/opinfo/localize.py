"""Finds the first ATen operator whose flagos result differs from the CPU's.

    python3 tests/opinfo/localize.py ENTRY DTYPE [--sample N] [--backward]

For a WRONG row of the sweep: reruns sample N of the OpInfo entry on flagos
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
import itertools
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

import harness  # noqa: E402


def _cpu(v: Any) -> Any:
    return v.detach().cpu() if isinstance(v, torch.Tensor) and v.device.type == harness.DEVICE else v


def _device(v: Any) -> Any:
    if isinstance(v, torch.device) and v.type == harness.DEVICE:
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
        if not any(t.device.type == harness.DEVICE for t in flagos_inputs + outputs):
            return out  # a CPU-only call (e.g. making the backward's weights)
        if any(t.is_conj() or t.is_neg() for t in flagos_inputs + outputs):
            # Lazy conj/neg bits: copying them under this mode is not reliable; not compared.
            self.skipped += 1
            return out
        try:
            expected = func(*cpu_args[0], **cpu_args[1])
        except Exception as e:  # the CPU refuses these arguments: report, go on
            self.differences.append(f"#{self.calls} {func}: the CPU raised {harness.describe(e)}")
            return out
        diff = harness.mismatch(harness.to_cpu(out), harness.to_cpu(expected), random=False, tol=None)
        if diff:
            shapes = [(tuple(t.shape), str(t.dtype), t.stride()) for t in flagos_inputs]
            self.differences.append(f"#{self.calls} {func} inputs {shapes}: {diff}")
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entry")
    parser.add_argument("dtype", choices=list(harness.DTYPES))
    parser.add_argument("--sample", type=int, default=0)
    parser.add_argument("--backward", action="store_true", help="also trace the backward")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    op = harness.all_entries()[args.entry]
    plan = {p.dtype: p.backward for p in harness.plan(op)}
    backward = plan.get(args.dtype, False)
    torch.manual_seed(harness.SAMPLE_SEED)
    samples = list(itertools.islice(op.sample_inputs("cpu", harness.DTYPES[args.dtype], requires_grad=backward),
                                    args.sample + 1))
    def run(device: str, mode: TorchDispatchMode) -> None:
        sample = harness.Copier(device).sample(samples[args.sample], entry=args.entry)
        with mode:
            out = op(sample.input, *sample.args, **sample.kwargs)
            if args.backward and backward:
                harness.gradients(sample.output_process_fn_grad(out), harness.grad_leaves(sample), device)

    on_cpu, on_flagos = LogOps(), CompareEachOp()
    run("cpu", on_cpu)
    run(harness.DEVICE, on_flagos)
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
