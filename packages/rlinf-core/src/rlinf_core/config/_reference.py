"""A Markdown reference of a config tree, read from its attrs classes (keys, types, defaults, meanings).

Every leaf field of a root config class becomes one table row: its dotted key, its type, its default, the
values its type or validators allow, and the first paragraph of its attribute docstring (the string literal
written right after the field in the class body, read from the source with ``ast``). Nested attrs classes
become their own keys (``actor.optim.lr``); sequences of attrs classes list their members under ``key[]``
(``cluster.node_groups[].label``).
"""

from __future__ import annotations

import ast
import builtins
import enum
import inspect
import itertools
import json
import math
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

__all__ = ["ConfigField", "config_fields", "config_reference", "field_docstrings"]

_NO_DEFAULT = object()
"""Marks a field without a default (required) or whose default could not be built."""


@attrs.frozen
class ConfigField:
    """One leaf key of a config tree.

    Attributes:
        key: dotted path from the root (``actor.optim.lr``; ``[]`` marks the members of a sequence).
        type: the field's type, rendered (``float | None``).
        default: the default, rendered as YAML (``null``, ``true``, ``0.2``) or ``required``.
        allowed: the values the type or the validators allow (``>= 1``, ``"mlp", "cnn"``), or ``""``.
        doc: the first paragraph of the attribute docstring on one line, or ``""`` when there is none.
        owner: the class that declares the field.
    """

    key: str
    type: str
    default: str
    allowed: str
    doc: str
    owner: builtins.type


_DOC_CACHE: dict[type, dict[str, str]] = {}


def field_docstrings(cls: type) -> dict[str, str]:
    """Attribute docstrings of the fields declared in ``cls``'s own body (not its bases), by field name.

    An attribute docstring is a string literal statement right after an annotated assignment. Each is
    returned as its first paragraph on one line.

    Raises:
        TypeError: ``cls`` has no retrievable source (defined interactively).
    """
    if cls in _DOC_CACHE:
        return _DOC_CACHE[cls]
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError) as e:
        raise TypeError(
            f"cannot read the source of {cls.__qualname__} for its attribute docstrings: {e}"
        ) from e
    tree = ast.parse(textwrap.dedent(source))
    body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef)), [])
    docs: dict[str, str] = {}
    for stmt, nxt in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = _first_paragraph(nxt.value.value)
    _DOC_CACHE[cls] = docs
    return docs


def _first_paragraph(text: str) -> str:
    paragraph = inspect.cleandoc(text).split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def _doc_of(cls: type, name: str) -> tuple[str, type]:
    """The docstring of field ``name`` and the class declaring it (searching ``cls``'s attrs bases)."""
    for klass in cls.__mro__:
        if not attrs.has(klass) or name not in {f.name for f in attrs.fields(klass)}:
            continue
        doc = field_docstrings(klass).get(name)
        if doc is not None:
            return doc, klass
    return "", cls


# ----------------------------------------------------------------------------------------------- types
def _is_none(tp: Any) -> bool:
    return tp is None or tp is type(None)


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(tp)
    return None


def _type_name(tp: Any) -> str:
    """A readable spelling of a type annotation (``float | None``, ``tuple[int, ...]``, ``str``)."""
    if _is_none(tp):
        return "None"
    if tp is Any:
        return "Any"
    if tp is Ellipsis:
        return "..."
    union = _union_args(tp)
    if union is not None:
        return " | ".join(_type_name(a) for a in union)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        kinds = {type(a).__name__ for a in typing.get_args(tp)}
        return " | ".join(sorted(kinds))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{args}]" if args else name
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _literal_values(tp: Any) -> list[Any] | None:
    """The choices of a ``Literal`` (or enum) type, also inside ``X | None``; ``None`` if it has none."""
    union = _union_args(tp)
    if union is not None:
        values: list[Any] = []
        found = False
        for arg in union:
            if _is_none(arg):
                values.append(None)
                continue
            inner = _literal_values(arg)
            if inner is not None:
                found = True
                values.extend(inner)
        return values if found else None
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [m.value for m in tp]
    return None


def _nested_class(tp: Any) -> tuple[type | None, bool, bool]:
    """``(attrs class, is_optional, is_sequence)`` when ``tp`` is an attrs class, ``C | None`` or ``tuple[C, ...]``."""
    if isinstance(tp, type) and attrs.has(tp):
        return tp, False, False
    union = _union_args(tp)
    if union is not None:
        rest = [a for a in union if not _is_none(a)]
        if len(rest) == 1 and len(rest) < len(union):
            inner, _, seq = _nested_class(rest[0])
            return inner, True, seq
        return None, False, False
    origin = typing.get_origin(tp)
    if origin in (tuple, list, Sequence) or origin is getattr(typing, "Sequence", None):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) == 1 and isinstance(args[0], type) and attrs.has(args[0]):
            return args[0], False, True
    return None, False, False


# ---------------------------------------------------------------------------------------------- values
def _yaml(value: Any) -> str:
    """``value`` as it would be written in a YAML config."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _yaml(value.value)
    if isinstance(value, float):
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value) if _needs_quotes(value) else value
    if attrs.has(type(value)):
        return (
            "{"
            + ", ".join(f"{f.name}: {_yaml(getattr(value, f.name))}" for f in attrs.fields(type(value)))
            + "}"
        )
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_yaml(k)}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


_YAML_WORDS = frozenset({"", "~", "null", "true", "false", "yes", "no", "on", "off"})
_YAML_SPECIAL = frozenset(":#,[]{}&*!|>'\"%@`")


def _needs_quotes(text: str) -> bool:
    """Whether YAML would read ``text`` unquoted as something other than this string."""
    if text.lower() in _YAML_WORDS or text.strip() != text or any(c in _YAML_SPECIAL for c in text):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def _default_value(field: attrs.Attribute[Any]) -> Any:
    default = field.default
    if default is attrs.NOTHING:
        return _NO_DEFAULT
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        factory: Any = default
        if factory.takes_self:
            return _NO_DEFAULT
        try:
            return factory.factory()
        except Exception:  # a factory that needs required values (e.g. a model path)
            return _NO_DEFAULT
    return default


# ------------------------------------------------------------------------------------------ validators
def _validators(validator: Any) -> Iterator[Any]:
    if validator is None:
        return
    inner = getattr(validator, "_validators", None)
    if isinstance(validator, list | tuple):
        inner = validator
    if inner is not None:
        for v in inner:
            yield from _validators(v)
        return
    yield validator


def _describe_validator(validator: Any) -> tuple[str, bool]:
    """``(text, optional)``: what one validator allows, and whether it also lets ``None`` through."""
    name = type(validator).__name__
    if name == "_OptionalValidator":
        parts = [_describe_validator(v)[0] for v in _validators(validator.validator)]
        return ", ".join(p for p in parts if p), True
    if name == "_NumberValidator":
        return f"{validator.compare_op} {_yaml(validator.bound)}", False
    if name == "_InValidator":
        return ", ".join(_yaml(o) for o in validator.options), False
    if name == "_MinLengthValidator":
        return f"length >= {validator.min_length}", False
    if name == "_MaxLengthValidator":
        return f"length <= {validator.max_length}", False
    if name == "_DeepIterable":
        members = [_describe_validator(v)[0] for v in _validators(validator.member_validator)]
        text = ", ".join(m for m in members if m)
        return (f"each {text}" if text else ""), False
    if callable(validator) and not isinstance(validator, type):
        doc = inspect.getdoc(validator)
        if doc and (inspect.isfunction(validator) or inspect.ismethod(validator)):
            return _first_paragraph(doc).rstrip("."), False
    return "", False


def _allowed(tp: Any, validator: Any) -> str:
    literal = _literal_values(tp)
    if literal is not None:
        return ", ".join(_yaml(v) for v in literal)
    parts: list[str] = []
    optional = False
    for v in _validators(validator):
        text, opt = _describe_validator(v)
        optional = optional or opt
        if text:
            parts.append(text)
    if not parts:
        return ""
    text = ", ".join(parts)
    union = _union_args(tp)
    if optional or (union is not None and any(_is_none(a) for a in union)):
        text += " or null"
    return text


# ------------------------------------------------------------------------------------------------ walk
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that only resolves under TYPE_CHECKING: keep the strings
        return {f.name: f.type for f in attrs.fields(cls)}


def config_fields(root_cls: type, *, prefix: str = "") -> list[ConfigField]:
    """Every leaf key of the config tree rooted at ``root_cls``, in declaration order.

    Defaults come from the parent's default instance where there is one (so ``EmbodiedConfig``'s own
    ``cluster`` default wins over ``ClusterConfig``'s), else from the nested class itself.

    Args:
        root_cls: an attrs class.
        prefix: prepended to every key (``"actor."``).

    Raises:
        TypeError: ``root_cls`` is not an attrs class.
    """
    if not (isinstance(root_cls, type) and attrs.has(root_cls)):
        raise TypeError(f"config_fields needs an attrs class, got {root_cls!r}")
    out: list[ConfigField] = []
    _walk(root_cls, prefix, _NO_DEFAULT, out)
    return out


def _walk(cls: type, prefix: str, instance: Any, out: list[ConfigField]) -> None:
    hints = _hints(cls)
    for field in attrs.fields(cls):
        tp = hints.get(field.name, field.type)
        key = prefix + field.name
        default = getattr(instance, field.name) if instance is not _NO_DEFAULT else _default_value(field)
        doc, owner = _doc_of(cls, field.name)
        nested, optional, sequence = _nested_class(tp)
        if nested is not None and not optional and not sequence:
            _walk(nested, key + ".", default if attrs.has(type(default)) else _NO_DEFAULT, out)
            continue
        out.append(
            ConfigField(
                key=key,
                type=_type_name(tp),
                default="required" if default is _NO_DEFAULT else _yaml(default),
                allowed=_allowed(tp, field.validator),
                doc=doc,
                owner=owner,
            )
        )
        if nested is not None:
            _walk(nested, key + ("[]." if sequence else "."), _NO_DEFAULT, out)


# --------------------------------------------------------------------------------------------- render
def _cell(text: str, *, code: bool = False) -> str:
    if not text:
        return ""
    if code:
        return "`" + text.replace("|", "\\|") + "`"
    return text.replace("|", "\\|")


def config_reference(
    root_cls: type,
    section_names: Sequence[str] | None = None,
    *,
    title: str | None = None,
    heading_level: int = 2,
    missing_doc: Callable[[ConfigField], str] | None = None,
) -> str:
    """A Markdown reference of ``root_cls``: one table per top-level section, one row per leaf key.

    Args:
        root_cls: the root attrs config class of an app.
        section_names: top-level fields to include, in this order; ``None`` means all, in declaration order.
            Top-level leaf keys (not attrs sections) are gathered in a first table.
        title: the heading text (default: the class name).
        heading_level: ``#`` count of the title; sections get one more.
        missing_doc: text for a field without an attribute docstring (default: empty).

    Returns:
        The Markdown text, ending with a newline.

    Raises:
        TypeError: ``root_cls`` is not an attrs class.
        ValueError: a name in ``section_names`` is not a field of ``root_cls`` (the message lists them).
    """
    rows = config_fields(root_cls)
    names = [f.name for f in attrs.fields(root_cls)]
    chosen = list(section_names) if section_names is not None else names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise ValueError(f"{root_cls.__qualname__} has no section(s) {unknown}; its fields: {names}")
    hashes = "#" * heading_level
    lines = [f"{hashes} {title or root_cls.__qualname__}", ""]
    groups: dict[str, list[ConfigField]] = {}
    for row in rows:
        head = row.key.split(".", 1)[0].removesuffix("[]")
        groups.setdefault(head, []).append(row)
    top_level = [n for n in chosen if [r.key for r in groups.get(n, [])] == [n]]
    sections = [n for n in chosen if n not in top_level]
    tables: list[tuple[str | None, list[ConfigField]]] = []
    if top_level:
        tables.append((None, [r for n in top_level for r in groups[n]]))
    tables.extend((n, groups.get(n, [])) for n in sections)
    for name, table in tables:
        if name is not None:
            lines += [f"{hashes}# `{name}`", ""]
        lines += ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        for r in table:
            doc = r.doc or (missing_doc(r) if missing_doc is not None else "")
            cells = [
                _cell(r.key, code=True),
                _cell(r.type, code=True),
                _cell(r.default, code=r.default != "required"),
                _cell(r.allowed),
                _cell(doc),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
