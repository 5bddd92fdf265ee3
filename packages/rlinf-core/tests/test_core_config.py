from __future__ import annotations

from pathlib import Path
from typing import Literal

import attrs
import pytest
from attrs import validators as v
from rlinf_core.config import (
    CommandLine,
    ConfigError,
    load_config,
    parse_command_line,
    structure_config,
    unstructure_config,
)


@attrs.frozen(kw_only=True)
class Logger:
    log_path: str = "runs/default"
    logger_backends: tuple[str, ...] = ("tensorboard",)


@attrs.frozen(kw_only=True)
class Runner:
    max_steps: int = attrs.field(default=100, validator=v.ge(1))
    save_interval: int = attrs.field(default=10, validator=v.ge(-1))
    resume_dir: str | None = None
    logger: Logger = Logger()


@attrs.frozen(kw_only=True)
class Algorithm:
    adv_type: Literal["gae", "grpo", "reinpp"] = "gae"
    gamma: float = attrs.field(default=0.99, validator=[v.ge(0.0), v.le(1.0)])


@attrs.frozen(kw_only=True)
class App:
    runner: Runner = Runner()
    algorithm: Algorithm = Algorithm()
    component_placement: dict[str, str] = attrs.field(factory=lambda: {"actor": "0"})
    seed: int


def _write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def test_yaml_and_overrides_build_frozen_config(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.yaml", "seed: 1\nrunner:\n  max_steps: 5\nalgorithm:\n  adv_type: grpo\n")
    cfg = load_config(
        App, path, ["runner.logger.log_path=/tmp/x", "algorithm.gamma=1", "runner.resume_dir=auto"]
    )
    assert cfg.runner.max_steps == 5
    assert cfg.runner.logger.log_path == "/tmp/x"
    assert cfg.algorithm.gamma == 1.0 and isinstance(cfg.algorithm.gamma, float)
    assert cfg.algorithm.adv_type == "grpo"
    assert cfg.runner.resume_dir == "auto"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]


def test_every_problem_is_reported_with_path_and_suggestion(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "c.yaml",
        "seed: one\nrunner:\n  max_step: 5\n  save_interval: -7\nalgorithm:\n  adv_type: gaee\n  gamma: 2.0\nextra: 1\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(App, path)
    problems = info.value.problems
    text = "\n".join(problems)
    assert len(problems) == 6, text
    assert "seed: expected int, got str 'one'" in text
    assert "runner.max_step: unknown key (did you mean 'runner.max_steps'?)" in text
    assert "runner.save_interval: 'save_interval' must be >= -1: -7" in text
    assert "algorithm.adv_type: 'gaee' is not one of 'gae', 'grpo', 'reinpp' (did you mean 'gae'?)" in text
    assert "algorithm.gamma: 'gamma' must be <= 1.0: 2.0" in text
    assert "extra: unknown key" in text
    assert str(path) in str(info.value)


def test_missing_required_and_bool_is_not_int() -> None:
    with pytest.raises(ConfigError, match="seed: missing required key"):
        structure_config(App, {})
    with pytest.raises(ConfigError, match="seed: expected int, got bool True"):
        structure_config(App, {"seed": True})


def test_nested_collections_are_checked() -> None:
    with pytest.raises(ConfigError) as info:
        structure_config(
            App,
            {"seed": 0, "component_placement": {"actor": 3}, "runner": {"logger": {"logger_backends": "tb"}}},
        )
    text = str(info.value)
    assert "component_placement.actor: expected str, got int 3" in text
    assert "runner.logger.logger_backends: expected a list, got str 'tb'" in text


def test_defaults_list_merges_base_file(tmp_path: Path) -> None:
    _write(tmp_path, "base.yaml", "seed: 1\nrunner:\n  max_steps: 5\n  save_interval: 2\n")
    child = _write(tmp_path, "child.yaml", "defaults: [base]\nrunner:\n  max_steps: 9\n")
    cfg = load_config(App, child)
    assert (cfg.seed, cfg.runner.max_steps, cfg.runner.save_interval) == (1, 9, 2)


def test_override_add_remove_and_errors() -> None:
    cfg = load_config(App, None, ["+seed=4", "runner.max_steps=7", "~runner.max_steps"])
    assert cfg.seed == 4 and cfg.runner == Runner()
    # Removing a whole section, or a key that is not there, would silently train on defaults: refused.
    with pytest.raises(ConfigError, match=r"runner is a whole section"):
        load_config(App, None, ["runner.max_steps=7", "~runner"])
    with pytest.raises(ConfigError, match=r"there is no runner to remove"):
        load_config(App, None, ["~runner"])
    with pytest.raises(ConfigError, match=r"expected key\.sub=value"):
        load_config(App, None, ["seed"])
    with pytest.raises(ConfigError, match="seed is a int, not a mapping"):
        load_config(App, None, ["seed=3", "seed.x=1"])


def test_duplicate_keys_and_empty_files_are_refused(tmp_path: Path) -> None:
    dup = _write(tmp_path, "dup.yaml", "seed: 1\nrunner:\n  max_steps: 5\n  max_steps: 6\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'max_steps' \(line 4; first on line 3\)"):
        load_config(App, dup)
    top = _write(tmp_path, "top.yaml", "seed: 1\nseed: 2\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'seed'"):
        load_config(App, top)
    empty = _write(tmp_path, "empty.yaml", "# nothing but a comment\n")
    with pytest.raises(ConfigError, match="the file is empty"):
        load_config(App, empty)
    with pytest.raises(ConfigError) as info:  # an explicit empty mapping is a config: only `seed` is missing
        load_config(App, _write(tmp_path, "defaults.yaml", "{}\n"))
    assert "the file is empty" not in str(info.value) and "seed: missing required key" in str(info.value)


def test_round_trip() -> None:
    cfg = structure_config(App, {"seed": 2})
    assert structure_config(App, unstructure_config(cfg)) == cfg


def test_command_line(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml", "seed: 1\n")
    _write(tmp_path, "b.yaml", "seed: 2\n")
    cl = parse_command_line(["--config-name", "b", "seed=3"], config_dir=tmp_path, default_name="a")
    assert cl == CommandLine(tmp_path / "b.yaml", ("seed=3",), False)
    cl = parse_command_line(["--print-config"], config_dir=tmp_path, default_name="a")
    assert isinstance(cl, CommandLine) and cl.config_path == tmp_path / "a.yaml" and cl.print_config
    assert "usage" in str(parse_command_line(["-h"], config_dir=tmp_path, default_name="a"))
    with pytest.raises(ConfigError, match="available: a, b"):
        parse_command_line(["--config-name=zzz"], config_dir=tmp_path, default_name="a")
    with pytest.raises(ConfigError, match="unknown option '--bogus'"):
        parse_command_line(["--bogus"], config_dir=tmp_path, default_name="a")


def test_exponent_floats_without_a_dot_are_numbers_in_files_and_overrides(tmp_path: Path) -> None:
    # PyYAML (YAML 1.1) reads `5e-3` as a string; learning rates are written that way.
    path = _write(tmp_path, "c.yaml", "seed: 1\nalgorithm:\n  gamma: 5e-1\n")
    assert load_config(App, path).algorithm.gamma == 0.5
    assert load_config(App, path, ["algorithm.gamma=2E-1"]).algorithm.gamma == 0.2
    assert load_config(App, path, ["runner.logger.log_path=1e3x"]).runner.logger.log_path == "1e3x"


# ----------------------------------------------------------------------------------- config reference
@attrs.frozen(kw_only=True)
class RefMember:
    """A member of a list section."""

    label: str
    """Unique name of the member."""
    sizes: tuple[int, ...] = attrs.field(default=(1, 2), validator=v.deep_iterable(v.gt(0)))
    """Widths, each positive."""


@attrs.frozen(kw_only=True)
class RefOptim:
    lr: float = attrs.field(default=1e-3, validator=v.gt(0.0))
    """Learning rate.

    A second paragraph that the reference leaves out."""
    beta: float = attrs.field(default=0.9, validator=[v.ge(0.0), v.lt(1.0)])
    """Decay of the first
    moment (wrapped docstring)."""
    schedule: Literal["constant", "linear"] | None = None
    """Learning-rate schedule | none."""
    clip: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))
    """Max gradient norm."""
    backend: str = attrs.field(default="fsdp", validator=v.in_(("fsdp", "megatron")))
    """Training backend."""
    undocumented: bool = False


@attrs.frozen(kw_only=True)
class RefOptimWithSeed(RefOptim):
    seed: int = 0
    """Seed of the optimizer's shuffle."""


@attrs.frozen(kw_only=True)
class RefRoot:
    name: str = "run: 1"
    """Top-level key."""
    optim: RefOptimWithSeed = attrs.field(factory=lambda: RefOptimWithSeed(lr=0.5))
    """The optimizer section."""
    members: tuple[RefMember, ...] = ()
    """Members of the run."""
    extra: RefOptim | None = None
    """An optional section."""


def test_config_fields_walks_nested_optional_and_list_sections() -> None:
    from rlinf_core.config import config_fields

    rows = {f.key: f for f in config_fields(RefRoot)}
    assert list(rows)[:3] == ["name", "optim.lr", "optim.beta"]
    # The parent's default instance wins over the nested class's own default (0.5, not 1e-3).
    assert rows["optim.lr"].default == "0.5" and rows["optim.lr"].allowed == "> 0.0"
    assert rows["optim.lr"].doc == "Learning rate."
    assert rows["optim.beta"].doc == "Decay of the first moment (wrapped docstring)."
    assert rows["optim.beta"].allowed == ">= 0.0, < 1.0"
    assert rows["optim.schedule"].type == "str | None"
    assert rows["optim.schedule"].allowed == "constant, linear, null"
    assert rows["optim.clip"].allowed == "> 0.0 or null" and rows["optim.clip"].default == "null"
    assert rows["optim.backend"].allowed == "fsdp, megatron"
    assert rows["optim.undocumented"].doc == "" and rows["optim.undocumented"].default == "false"
    # A field inherited from a base class takes its docstring (and owner) from that base.
    assert rows["optim.lr"].owner is RefOptim and rows["optim.seed"].owner is RefOptimWithSeed
    assert rows["optim.seed"].doc == "Seed of the optimizer's shuffle."
    # A string YAML would misread is quoted.
    assert rows["name"].default == '"run: 1"'
    # Sequences of sections list their members under key[]; optional sections keep their own row.
    assert rows["members"].type == "tuple[RefMember, ...]" and rows["members"].default == "[]"
    assert rows["members[].label"].default == "required"
    assert rows["members[].sizes"].allowed == "each > 0" and rows["members[].sizes"].default == "[1, 2]"
    assert rows["extra"].type == "RefOptim | None" and rows["extra"].doc == "An optional section."
    assert rows["extra.lr"].default == "0.001"
    assert "optim" not in rows  # a plain nested section has no row of its own


def test_config_reference_renders_markdown_tables() -> None:
    from rlinf_core.config import config_reference

    text = config_reference(RefRoot, ["optim", "name"], title="demo", missing_doc=lambda f: f"({f.key})")
    lines = text.splitlines()
    assert lines[0] == "## demo"
    # Top-level leaf keys come first, then one table per section, in the order asked for.
    assert lines.index('| `name` | `str` | `"run: 1"` |  | Top-level key. |') < lines.index("### `optim`")
    assert (
        "| `optim.schedule` | `str \\| None` | `null` | constant, linear, null | Learning-rate schedule \\| none. |"
        in lines
    )
    assert "| `optim.undocumented` | `bool` | `false` |  | (optim.undocumented) |" in lines
    assert "members" not in text and text.endswith("\n")
    with pytest.raises(
        ValueError, match=r"no section\(s\) \['bogus'\]; its fields: \['name', 'optim', 'members', 'extra'\]"
    ):
        config_reference(RefRoot, ["bogus"])
    with pytest.raises(TypeError, match="needs an attrs class"):
        config_reference(int)


def _ranks(value: object) -> tuple[int, ...]:
    """A field converter that also takes a range text (``"0-2"``) or a single int."""
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str) and "-" in value:
        lo, hi = value.split("-")
        return tuple(range(int(lo), int(hi) + 1))
    if isinstance(value, list | tuple) and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise ValueError(f"node_ranks: expected an int, a range 'a-b' or a list of ints, got {value!r}")


@attrs.frozen
class _WithConverter:
    node_ranks: tuple[int, ...] = attrs.field(converter=_ranks)


def test_a_field_converter_accepts_the_shapes_its_type_does_not_spell_out() -> None:
    assert structure_config(_WithConverter, {"node_ranks": [0, 1]}).node_ranks == (0, 1)
    assert structure_config(_WithConverter, {"node_ranks": "0-2"}).node_ranks == (0, 1, 2)
    assert structure_config(_WithConverter, {"node_ranks": 3}).node_ranks == (3,)
    with pytest.raises(ConfigError, match=r"node_ranks: node_ranks: expected an int, a range 'a-b'.*got 'x'"):
        structure_config(_WithConverter, {"node_ranks": "x"})
