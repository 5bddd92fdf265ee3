"""Write docs/config.md, the reference of every config key of every app, from the config classes.

    uv run python scripts/gen_config_reference.py           # rewrite docs/config.md
    uv run python scripts/gen_config_reference.py --check   # exit 1 if docs/config.md is stale

``tests/test_config_reference.py`` fails when the committed file differs from what this script writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlinf_core.config import ConfigField, config_reference
from rlinf_runners.apps import APPS, EmbodiedSFTConfig

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "config.md"
COMMAND = "uv run python scripts/gen_config_reference.py"

HEADER = f"""# Configuration reference

Every key of every app's config, generated from the config classes (their fields, validators and
attribute docstrings) by `{COMMAND}`. Do not edit by hand: `tests/test_config_reference.py` fails when
this file is stale. A YAML file or a `key.sub=value` override sets any of these keys; an unknown key, a
wrong type or a value outside the allowed ones is an error that names the key before anything starts.

Columns: the dotted **key**; its Python **type**; the **default** of the app (`required`: no default);
the values the type or the field's validators **allow** (empty: any value of the type); the first
paragraph of the field's docstring. `key[]` rows describe each member of a list.
"""


def root_classes() -> dict[str, type]:
    """The root config class of every app, by app name (``rlinf_runners.apps.APPS``), and of embodied SFT."""
    return {name: app.config_cls for name, app in APPS.items()} | {"embodied_sft": EmbodiedSFTConfig}


def _missing(field: ConfigField) -> str:
    raise ValueError(
        f"config key {field.key!r} ({field.owner.__module__}.{field.owner.__qualname__}) has no attribute "
        "docstring: add a string literal right after the field that says what it means"
    )


def render() -> str:
    """The full text of docs/config.md."""
    classes = root_classes()
    links = " · ".join(f"[{app}](#{app})" for app in classes)
    parts = [HEADER.rstrip("\n") + f"\n\nApps: {links}."]
    for app, cls in classes.items():
        text = config_reference(cls, title=app, missing_doc=_missing).rstrip("\n")
        parts.append(text.replace(f"## {app}\n", f"## {app}\n\nRoot class `{cls.__name__}`.\n", 1))
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
