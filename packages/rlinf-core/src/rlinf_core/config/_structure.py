"""Turn plain YAML data into frozen attrs config classes, reporting every problem at once.

cattrs stops at the first failing validator and loses its message, so the walk over attrs classes is done
here: unknown keys (with the closest valid name), wrong types, values outside a ``Literal``'s choices and
failing field validators are all collected with their dotted path, then raised together as one
``ConfigError`` — before anything expensive (Ray, models) starts.
"""

from __future__ import annotations

import difflib
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, Union

import attrs
import cattrs

__all__ = ["ConfigError", "structure_config", "unstructure_config"]

T = TypeVar("T")

_MISSING = object()

# Leaf types other than the YAML scalars (Path, enums of other shapes, ...) are structured by cattrs.
_CONVERTER = cattrs.Converter(forbid_extra_keys=True)


class ConfigError(ValueError):
    """Raised for an invalid configuration; ``problems`` lists each one with its dotted path."""

    def __init__(self, problems: Sequence[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} configuration problem(s){where}:\n{lines}")


def structure_config(cls: type[T], data: Any, *, source: str | None = None) -> T:
    """Build ``cls`` (an attrs class) from ``data`` (nested dicts/lists/scalars), validating everything.

    Raises:
        ConfigError: listing every unknown key (with the closest valid one), type error, out-of-range value
            and failed validator, each with its dotted path.
    """
    problems: list[str] = []
    result = _structure(cls, data, "", problems)
    if problems:
        raise ConfigError(problems, source)
    return typing.cast(T, result)


def unstructure_config(obj: Any) -> Any:
    """The plain-data (YAML-ready) form of a config object."""
    if attrs.has(type(obj)):
        return {f.name: unstructure_config(getattr(obj, f.name)) for f in attrs.fields(type(obj))}
    if isinstance(obj, Mapping):
        return {k: unstructure_config(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [unstructure_config(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _structure(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    where = path or "<root>"
    if tp is Any or tp is object:
        return value
    if attrs.has(tp):
        return _structure_attrs(tp, value, path, problems)
    if origin in (Union, types.UnionType):
        return _structure_union(tp, args, value, path, problems)
    if origin is typing.Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{where}: {_describe(value)} is not one of {', '.join(repr(a) for a in args)}{hint}")
        return _MISSING
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            problems.append(f"{where}: {_describe(value)} is not one of {allowed}")
            return _MISSING
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        return _structure_sequence(tp, origin, args, value, path, problems)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return _structure_mapping(args, value, path, problems)
    return _structure_scalar(tp, value, where, problems)


def _structure_scalar(tp: Any, value: Any, where: str, problems: list[str]) -> Any:
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif tp is str:
        ok = isinstance(value, str)
    elif isinstance(tp, type) and isinstance(value, tp):
        ok = True
    else:
        try:
            return _CONVERTER.structure(value, tp)
        except Exception as e:  # cattrs raises many types; report them uniformly
            problems.append(
                f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {_describe(value)} ({e})"
            )
            return _MISSING
    if not ok:
        problems.append(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {_describe(value)}")
        return _MISSING
    return value


def _structure_union(tp: Any, args: tuple[Any, ...], value: Any, path: str, problems: list[str]) -> Any:
    if value is None:
        if type(None) in args:
            return None
        problems.append(f"{path or '<root>'}: must not be null (expected {_type_name(tp)})")
        return _MISSING
    candidates = [a for a in args if a is not type(None)]
    # Prefer the alternative whose structure produces no problems; report the first one's otherwise.
    first_problems: list[str] | None = None
    for alt in candidates:
        trial: list[str] = []
        result = _structure(alt, value, path, trial)
        if not trial:
            return result
        if first_problems is None:
            first_problems = trial
    if len(candidates) == 1 and first_problems:
        problems.extend(first_problems)
    else:
        problems.append(
            f"{path or '<root>'}: expected {_type_name(tp)}, got {type(value).__name__} {_describe(value)}"
        )
    return _MISSING


def _structure_sequence(
    tp: Any, origin: Any, args: tuple[Any, ...], value: Any, path: str, problems: list[str]
) -> Any:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        problems.append(f"{path or '<root>'}: expected a list, got {type(value).__name__} {_describe(value)}")
        return _MISSING
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            problems.append(f"{path}: expected {len(args)} items, got {len(value)}")
            return _MISSING
        items = [
            _structure(a, v, _join(path, i), problems)
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        ]
    else:
        item_tp = args[0] if args else Any
        items = [_structure(item_tp, v, _join(path, i), problems) for i, v in enumerate(value)]
    return tuple(items) if origin is tuple or tp is tuple else list(items)


def _structure_mapping(args: tuple[Any, ...], value: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(value, Mapping):
        problems.append(
            f"{path or '<root>'}: expected a mapping, got {type(value).__name__} {_describe(value)}"
        )
        return _MISSING
    key_tp, val_tp = args if args else (Any, Any)
    out = {}
    for k, v in value.items():
        sk = _structure(key_tp, k, _join(path, k), problems)
        out[sk] = _structure(val_tp, v, _join(path, k), problems)
    return out


def _convert(field: attrs.Attribute[Any], value: Any, path: str, problems: list[str]) -> Any:
    converter = field.converter
    if not callable(converter):  # an attrs Converter object wraps the callable
        converter = getattr(converter, "converter", None)
    if converter is None:
        problems.append(f"{path}: {_describe(value)} is not accepted")
        return _MISSING
    try:
        return converter(value)
    except (ValueError, TypeError) as e:
        problems.append(f"{path}: {e}")
        return _MISSING


def _structure_attrs(cls: type, value: Any, path: str, problems: list[str]) -> Any:
    where = path or "<root>"
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        problems.append(
            f"{where}: expected a mapping for {cls.__name__}, got {type(value).__name__} {_describe(value)}"
        )
        return _MISSING
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in attrs.fields(cls)}
    for key in value:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = f" (did you mean {_join(path, close[0])!r}?)" if close else ""
            valid = ", ".join(fields)
            problems.append(f"{_join(path, key)}: unknown key{hint}; valid keys here: {valid}")
    kwargs: dict[str, Any] = {}
    before = len(problems)
    for name, field in fields.items():
        if name not in value:
            if field.default is attrs.NOTHING:
                problems.append(f"{_join(path, name)}: missing required key")
            continue
        n_before = len(problems)
        sub = _structure(hints.get(name, Any), value[name], _join(path, name), problems)
        if (len(problems) > n_before or sub is _MISSING) and field.converter is not None:
            # The field's converter also accepts the YAML shapes the type does not spell out (RLinf's
            # ``node_ranks: 0-3`` or ``hardware: {type, configs}``); its own error is the precise one.
            del problems[n_before:]
            sub = _convert(field, value[name], _join(path, name), problems)
        if len(problems) > n_before or sub is _MISSING:
            continue
        if field.validator is not None:
            try:
                field.validator(None, field, sub)
            except (ValueError, TypeError) as e:
                problems.append(f"{_join(path, name)}: {e}")
                continue
        kwargs[field.alias or name] = sub
    if len(problems) > before:
        return _MISSING
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        problems.append(f"{where}: {e}")
        return _MISSING
