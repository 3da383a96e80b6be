"""torch_fl._import_hooks.when_imported: how torch_fl registers flagos with
frameworks it must not import itself (Lightning). Each test imports a module
of its own, written to a temporary folder."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from torch_fl import _import_hooks


@pytest.fixture
def module_dir(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith("hooked_")]:
        del sys.modules[name]


def test_the_function_runs_after_the_modules_body_at_its_first_import(module_dir: Path) -> None:
    (module_dir / "hooked_later.py").write_text("VALUE = 42\n")
    seen: list[tuple[ModuleType, int]] = []
    _import_hooks.when_imported("hooked_later", lambda m: seen.append((m, m.VALUE)))
    assert seen == []
    import hooked_later  # noqa: PLC0415
    assert seen == [(hooked_later, 42)]
    # The module keeps its own loader, and the function does not run again.
    assert type(hooked_later.__loader__).__name__ == "SourceFileLoader"
    del sys.modules["hooked_later"]
    import hooked_later  # noqa: F811, PLC0415
    assert len(seen) == 1


def test_an_imported_module_gets_the_function_at_once(module_dir: Path) -> None:
    (module_dir / "hooked_now.py").write_text("VALUE = 7\n")
    import hooked_now  # noqa: PLC0415
    seen: list[int] = []
    _import_hooks.when_imported("hooked_now", lambda m: seen.append(m.VALUE))
    assert seen == [7]


def test_a_failing_function_warns_and_the_import_succeeds(module_dir: Path) -> None:
    (module_dir / "hooked_failing.py").write_text("VALUE = 1\n")

    def fail(module: ModuleType) -> None:
        raise RuntimeError("boom")

    _import_hooks.when_imported("hooked_failing", fail)
    with pytest.warns(RuntimeWarning, match=r"registering flagos with hooked_failing failed "
                                            r"\(RuntimeError: boom\)"):
        import hooked_failing  # noqa: PLC0415
    assert hooked_failing.VALUE == 1
