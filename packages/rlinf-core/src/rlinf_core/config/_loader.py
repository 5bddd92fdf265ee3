"""YAML files + Hydra-style command-line overrides → a validated, frozen config object."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import yaml

from ._structure import ConfigError, structure_config

__all__ = ["CommandLine", "apply_override", "load_config", "load_yaml", "parse_command_line"]


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` for config files.

    It reads YAML 1.2 floats (``5e-6`` and ``1E3`` are numbers, not strings) and refuses a mapping that repeats a
    key (plain PyYAML keeps the last one silently).
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (line {line}; first on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)


def _safe_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


T = TypeVar("T")

USAGE = """\
usage: {prog} [--config-name NAME | --config PATH] [--print-config] [key.sub=value ...]

  --config-name NAME   a config from {config_dir} (default: {default})
  --config PATH        a YAML file anywhere
  --print-config       print the resolved configuration as YAML and exit
  key.sub=value        override one value (YAML syntax: 3, 1e-3, true, null, [0, 1], "text");
                       +key=value adds a key, ~key removes one
"""


@attrs.frozen
class CommandLine:
    """The parsed command line of an app entry point."""

    config_path: Path
    overrides: tuple[str, ...]
    print_config: bool = False


def parse_command_line(
    argv: Sequence[str], *, config_dir: str | Path, default_name: str, prog: str = "train.py"
) -> CommandLine | str:
    """Parse ``[--config-name NAME | --config PATH] [--print-config] key=value ...``.

    Returns:
        A ``CommandLine``, or the usage text when ``-h/--help`` was given.

    Raises:
        ConfigError: for an unknown flag, a missing flag value, or a config that does not exist (listing the
            available config names).
    """
    config_dir = Path(config_dir)
    name: str | None = None
    path: Path | None = None
    overrides: list[str] = []
    print_config = False
    problems: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, inline = arg.partition("=")
        if arg in ("-h", "--help"):
            return USAGE.format(prog=prog, config_dir=config_dir, default=default_name)
        if flag in ("--config-name", "--config", "--config-path", "-cn", "-cp"):
            if eq:
                val = inline
            elif i + 1 < len(args):
                i += 1
                val = args[i]
            else:
                problems.append(f"{flag} needs a value")
                break
            if flag in ("--config-name", "-cn"):
                name = val
            elif flag == "--config":
                path = Path(val)
            else:
                config_dir = Path(val)
        elif arg == "--print-config":
            print_config = True
        elif arg.startswith("-") and not arg.startswith("~"):
            problems.append(
                f"unknown option {arg!r}; options: --config-name, --config, --config-path, --print-config"
            )
        elif "=" in arg or arg.startswith("~"):
            overrides.append(arg)
        else:
            problems.append(f"cannot parse argument {arg!r}: overrides look like key.sub=value")
        i += 1
    if path is None:
        chosen = (name or default_name).removesuffix(".yaml")
        path = config_dir / f"{chosen}.yaml"
        if not path.is_file() and not problems:
            available = sorted(p.stem for p in config_dir.glob("*.yaml"))
            problems.append(
                f"--config-name {chosen!r} not found in {config_dir}; available: {', '.join(available)}"
            )
    elif not path.is_file():
        problems.append(f"--config {str(path)!r}: no such file")
    if problems:
        raise ConfigError(problems, "the command line")
    return CommandLine(path, tuple(overrides), print_config)


def load_yaml(path: str | Path, *, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config, resolving its ``defaults: [other, ...]`` list (files next to it, merged first)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError([f"defaults cycle: {' -> '.join(str(p) for p in (*_seen, path))}"], str(path))
    try:
        data = _safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError([f"invalid YAML: {e}"], str(path)) from None
    if data is None:
        raise ConfigError(
            ["the file is empty; a config needs at least one key (an empty mapping `{}` means all defaults)"],
            str(path),
        )
    if not isinstance(data, dict):
        raise ConfigError([f"top level must be a mapping, got {type(data).__name__}"], str(path))
    merged: dict[str, Any] = {}
    for base in data.pop("defaults", None) or []:
        if not isinstance(base, str):
            raise ConfigError([f"defaults entries are config names, got {base!r}"], str(path))
        base_path = path.parent / f"{base.removesuffix('.yaml')}.yaml"
        if not base_path.is_file():
            raise ConfigError([f"defaults: {base!r} not found next to this file"], str(path))
        _deep_merge(merged, load_yaml(base_path, _seen=(*_seen, path)))
    _deep_merge(merged, data)
    return merged


def _deep_merge(dst: MutableMapping[str, Any], src: Mapping[str, Any]) -> None:
    for key, val in src.items():
        if isinstance(val, Mapping) and isinstance(dst.get(key), MutableMapping):
            _deep_merge(dst[key], val)
        else:
            dst[key] = copy.deepcopy(val)


def apply_override(data: MutableMapping[str, Any], override: str) -> None:
    """Apply one ``key.sub=value`` / ``+key=value`` / ``~key`` override to ``data`` in place.

    Raises:
        ConfigError: when the override cannot be parsed or walks through a non-mapping value.
    """
    remove = override.startswith("~")
    text = override[1:] if remove or override.startswith("+") else override
    dotted, eq, raw = text.partition("=")
    dotted = dotted.strip()
    if not dotted or (not eq and not remove):
        raise ConfigError([f"cannot parse override {override!r}: expected key.sub=value"], "the command line")
    keys = dotted.split(".")
    node: Any = data
    for depth, key in enumerate(keys[:-1]):
        nxt = node.get(key)
        if nxt is None:
            nxt = node[key] = {}
        if not isinstance(nxt, MutableMapping):
            where = ".".join(keys[: depth + 1])
            raise ConfigError(
                [f"override {override!r}: {where} is a {type(nxt).__name__}, not a mapping"],
                "the command line",
            )
        node = nxt
    if remove:
        if keys[-1] not in node:
            raise ConfigError([f"override {override!r}: there is no {dotted} to remove"], "the command line")
        if isinstance(node[keys[-1]], Mapping):
            raise ConfigError(
                [
                    f"override {override!r}: {dotted} is a whole section; removing it would silently fall back "
                    f"to the built-in defaults (remove single keys, e.g. ~{dotted}.<key>)"
                ],
                "the command line",
            )
        node.pop(keys[-1])
        return
    try:
        value = _safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(
            [f"override {override!r}: value is not valid YAML ({e})"], "the command line"
        ) from None
    node[keys[-1]] = value


def load_config(schema: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Load ``path`` (YAML; optional), apply ``overrides`` and build a validated ``schema`` instance.

    Args:
        schema: the attrs config class of the app (e.g. ``EmbodiedConfig``).
        path: a YAML file; ``None`` starts from the schema's defaults.
        overrides: Hydra-style ``key.sub=value`` strings, applied in order.

    Raises:
        ConfigError: listing every problem (unknown keys with the closest valid one, wrong types,
            out-of-range values), each with its dotted path.
    """
    data: dict[str, Any] = load_yaml(path) if path is not None else {}
    for override in overrides:
        apply_override(data, override)
    source = str(path) if path is not None else None
    if overrides:
        source = f"{source or 'defaults'} + overrides"
    return structure_config(schema, data, source=source)
