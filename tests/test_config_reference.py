"""docs/config.md is what scripts/gen_config_reference.py writes from the config classes of every app."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import attrs

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    name = "_rlinf_gen_config_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "gen_config_reference.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_config_reference_is_up_to_date() -> None:
    gen = _script()
    expected = gen.render()  # raises, naming the key, when a config field has no attribute docstring
    current = gen.OUTPUT.read_text() if gen.OUTPUT.exists() else ""
    if current != expected:
        stale = sorted(set(expected.splitlines()) ^ set(current.splitlines()))[:5]
        raise AssertionError(
            f"docs/config.md is stale: run `{gen.COMMAND}` and commit the result. First differing lines:\n"
            + "\n".join(stale)
        )


def test_every_app_root_config_is_documented() -> None:
    gen = _script()
    text = gen.OUTPUT.read_text()
    for app, cls in gen.root_classes().items():
        assert attrs.has(cls), f"{app}: {cls!r} is not an attrs config class"
        assert f"## {app}\n" in text
        for field in attrs.fields(cls):
            assert f"`{field.name}" in text, f"{app}: section {field.name!r} missing from docs/config.md"
