"""docs/reference/errors.md states the daemon's limits; each one must equal
the constant it names in a header under daemon/, so the page cannot drift."""

from __future__ import annotations

import re

from flagos_test_env import REPO

DOC = REPO / "docs" / "reference" / "errors.md"


def constants() -> dict[str, int]:
    """`inline constexpr T kName = <expr>;` (and `static constexpr`) in the headers under daemon/."""
    found: dict[str, int] = {}
    pattern = re.compile(r"(?:inline|static) constexpr \w+ (k\w+) = ([^;]+);")
    for header in (REPO / "daemon").rglob("*.h"):
        for name, expr in pattern.findall(header.read_text()):
            expr = re.sub(r"(\d+)(?:ull|u|ll)\b", r"\1", expr)
            if re.fullmatch(r"[\d\s<()+\-*]+", expr):
                found[name] = eval(expr)  # noqa: S307  digits and operators only
    return found


def test_every_limit_in_the_doc_matches_the_source() -> None:
    values = constants()
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ") and "`k" in line]
    assert len(rows) >= 14, "the limits table went missing"
    checked = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`(k\w+)`", cells[1])
        numbers = [int(n) for n in re.findall(r"\d+", re.sub(r"`k\w+`|\(|\)", "", cells[1]))]
        assert names, row
        for name in names:
            assert name in values, f"{name} (in errors.md) is not a constant in a header under daemon/"
            assert values[name] in numbers, f"errors.md says {cells[1]!r}; {name} is {values[name]}"
            checked += 1
    assert checked >= 15
