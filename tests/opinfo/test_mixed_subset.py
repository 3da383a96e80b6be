"""CI subset of the mixed-operand sweep: where meta functions and CPU kernels disagreed, and each family.

Each entry (families.MIXED_SUBSET) runs its first MIXED_SUBSET_MAX_SAMPLES
float32 samples as variants with an operand of another dtype, the input in
float64, or a 0-dim operand on the CPU, on the CPU and on flagos, through the
worker the full sweep uses (scripts/mixed-sweep ops); every (entry, mode)
must be PASS or SKIPPED_ON_CPU. `where` (uint8 condition), `addr`,
`huber_loss` and `normal` (mixed dtypes) failed before flagos let the kernel
decide (tests/python/test_kernel_over_meta.py).
"""

from __future__ import annotations

import pytest

from driver import Sweeper
from families import MIXED_SUBSET, subset_entries
from results import PASS, format_rows, not_passing


def test_mixed_subset_names_exist(mixed_sweeper: Sweeper) -> None:
    known = set(mixed_sweeper.entries())
    missing = [entry for entry in subset_entries(MIXED_SUBSET) if entry not in known]
    assert not missing, f"not OpInfo entries in this torch: {missing}"


@pytest.mark.parametrize("entry", subset_entries(MIXED_SUBSET))
def test_mixed_entry(mixed_sweeper: Sweeper, entry: str) -> None:
    rows = mixed_sweeper.run_entry(entry)
    assert rows, f"{entry}: no results"
    bad = not_passing(rows)
    assert not bad, f"{entry}:\n{format_rows(bad)}"
    if entry in MIXED_SUBSET["meta and kernel disagreed"]:
        assert any(r.verdict == PASS for r in rows), f"{entry}: no variant ran on the CPU:\n{format_rows(rows)}"
