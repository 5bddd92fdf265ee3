"""Write docs/config.md, the reference of every config key of every app, from the config classes.

    uv run python scripts/gen_config_reference.py           # rewrite docs/config.md
    uv run python scripts/gen_config_reference.py --check   # exit 1 if docs/config.md is stale

``tests/test_config_reference.py`` fails when the committed file differs from what this script writes.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from rlinf_core.config import ConfigField, config_reference

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "config.md"
COMMAND = "uv run python scripts/gen_config_reference.py"

APPS: dict[str, tuple[str, str]] = {
    "embodied": ("apps/embodied/config.py", "EmbodiedConfig"),
    "reasoning": ("apps/reasoning/config.py", "ReasoningConfig"),
    "agent": ("apps/agent/config.py", "AgentAppConfig"),
}
"""The root config class of each app: ``app -> (file, class name)``. The one list of apps documented."""

HEADER = f"""# Configuration reference

Every key of every app's config, generated from the config classes (their fields, validators and
attribute docstrings) by `{COMMAND}`. Do not edit by hand: `tests/test_config_reference.py` fails when
this file is stale. A YAML file or a `key.sub=value` override sets any of these keys; an unknown key, a
wrong type or a value outside the allowed ones is an error that names the key before anything starts.

Columns: the dotted **key**; its Python **type**; the **default** of the app (`required`: no default);
the values the type or the field's validators **allow** (empty: any value of the type); the first
paragraph of the field's docstring. `key[]` rows describe each member of a list.

Apps: {" · ".join(f"[{app}](#{app})" for app in APPS)}.
"""


def _load(app: str, relpath: str) -> ModuleType:
    name = f"_rlinf_app_{app}_config"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {relpath}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the class source (attribute docstrings) is found through sys.modules
    spec.loader.exec_module(module)
    return module


def root_classes() -> dict[str, type]:
    """The root config class of each app in :data:`APPS`."""
    return {app: getattr(_load(app, path), cls) for app, (path, cls) in APPS.items()}


def _missing(field: ConfigField) -> str:
    raise ValueError(
        f"config key {field.key!r} ({field.owner.__module__}.{field.owner.__qualname__}) has no attribute "
        "docstring: add a string literal right after the field that says what it means"
    )


def render() -> str:
    """The full text of docs/config.md."""
    parts = [HEADER.rstrip("\n")]
    for app, cls in root_classes().items():
        path = APPS[app][0]
        parts.append(config_reference(cls, title=app, missing_doc=_missing).rstrip("\n"))
        parts[-1] = parts[-1].replace(f"## {app}\n", f"## {app}\n\n`{cls.__name__}` ({path})\n", 1)
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/config.md, or with ``--check`` report whether it is stale; returns the exit code."""
    parser = argparse.ArgumentParser(description="Write docs/config.md from the config classes.")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
