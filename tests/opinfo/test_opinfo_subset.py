"""CI subset of the OpInfo sweep: representative entries of every operator family.

Each entry (families.SUBSET) runs at every sweep dtype it supports, on the
CPU and on flagos, through the same worker the full sweep uses
(scripts/op-sweep); every (entry, dtype) must be PASS or SKIPPED_ON_CPU,
forward and, where gradients are compared, backward.
"""

from __future__ import annotations

import pytest

from driver import Sweeper
from families import SUBSET, subset_entries
from results import format_rows, not_passing


def test_subset_names_exist(sweeper: Sweeper) -> None:
    known = set(sweeper.entries())
    missing = [entry for entry in subset_entries() if entry not in known]
    assert not missing, f"not OpInfo entries in this torch: {missing}"
    assert all(SUBSET.values()), "every family needs entries"


@pytest.mark.parametrize("entry", subset_entries())
def test_entry(sweeper: Sweeper, entry: str) -> None:
    rows = sweeper.run_entry(entry)
    assert rows, f"{entry}: no results"
    bad = not_passing(rows)
    assert not bad, f"{entry}:\n{format_rows(bad)}"
