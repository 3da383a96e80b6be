"""CI subset of the module sweep: representative modules of every family.

Each module (families.MODULE_SUBSET) runs its first
MODULE_SUBSET_MAX_SAMPLES samples at float32 and float64, in train and in
eval mode, on the CPU and on flagos, through the same worker the full sweep
uses (scripts/module-sweep); every (module, dtype, mode) must be PASS or
SKIPPED_ON_CPU, forward and backward.
"""

from __future__ import annotations

import pytest

from driver import Sweeper
from families import MODULE_SUBSET, subset_entries
from results import format_rows, not_passing


def test_module_subset_names_exist(module_sweeper: Sweeper) -> None:
    known = set(module_sweeper.entries())
    missing = [entry for entry in subset_entries(MODULE_SUBSET) if entry not in known]
    assert not missing, f"not ModuleInfo entries in this torch: {missing}"
    assert all(MODULE_SUBSET.values()), "every family needs modules"


@pytest.mark.parametrize("entry", subset_entries(MODULE_SUBSET))
def test_module(module_sweeper: Sweeper, entry: str) -> None:
    rows = module_sweeper.run_entry(entry)
    assert rows, f"{entry}: no results"
    bad = not_passing(rows)
    assert not bad, f"{entry}:\n{format_rows(bad)}"
