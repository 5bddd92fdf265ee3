"""`lazy_exports`: names load on first access, once, from the listed submodule; others raise AttributeError."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from rlinf_core import lazy_exports


def _make_package(root: Path, name: str) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            from rlinf_core import lazy_exports

            LIGHT = 1
            __getattr__ = lazy_exports(__name__, {"Heavy": "._heavy", "other": "._heavy", "absent": "._heavy"})
            """
        )
    )
    (pkg / "_heavy.py").write_text("LOADS = []\nLOADS.append(1)\n\nclass Heavy:\n    pass\n\nother = 42\n")


def test_names_load_on_first_use_and_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make_package(tmp_path, "lazy_demo_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazy_demo_pkg  # type: ignore[import-not-found]  # written into tmp_path by this test

    try:
        assert "lazy_demo_pkg._heavy" not in sys.modules
        heavy = lazy_demo_pkg.Heavy
        assert heavy.__module__ == "lazy_demo_pkg._heavy"
        assert lazy_demo_pkg.__dict__["Heavy"] is heavy  # cached: later lookups skip __getattr__
        assert lazy_demo_pkg.other == 42
        assert sys.modules["lazy_demo_pkg._heavy"].LOADS == [1]  # imported exactly once
        from lazy_demo_pkg import Heavy  # type: ignore[import-not-found]

        assert Heavy is heavy
        with pytest.raises(AttributeError, match="module 'lazy_demo_pkg' has no attribute 'nope'"):
            _ = lazy_demo_pkg.nope
        with pytest.raises(AttributeError, match="absent"):  # listed, but the submodule lacks it
            _ = lazy_demo_pkg.absent
    finally:
        for mod in ("lazy_demo_pkg", "lazy_demo_pkg._heavy"):
            sys.modules.pop(mod, None)


def test_unknown_name_message() -> None:
    getattr_ = lazy_exports("some.pkg", {"X": "._x"})
    with pytest.raises(AttributeError, match=r"module 'some.pkg' has no attribute 'Y'"):
        getattr_("Y")
