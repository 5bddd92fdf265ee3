"""Workspace-level invariants: dependency direction, import hygiene, lint and strict typing."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["algos", "scheduler", "core", "envs", "models", "rollout", "runners"]

# What each package may import from the workspace (docs/architecture.md#the-package-graph: never reversed, never circular).
ALLOWED: dict[str, set[str]] = {
    "algos": set(),
    "scheduler": set(),
    "core": {"algos", "scheduler"},
    "envs": {"algos", "scheduler", "core"},
    "models": {"algos", "scheduler", "core"},
    "rollout": {"algos", "scheduler", "core", "models"},
    "runners": {"algos", "scheduler", "core", "envs", "models", "rollout"},
}


def _workspace_imports(src: Path) -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for path in src.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top.startswith("rlinf_"):
                    found.setdefault(top.removeprefix("rlinf_"), set()).add(path)
    return found


@pytest.mark.parametrize("pkg", PACKAGES)
def test_dependency_direction(pkg: str) -> None:
    src = ROOT / "packages" / f"rlinf-{pkg}" / "src" / f"rlinf_{pkg}"
    imported = _workspace_imports(src)
    imported.pop(pkg, None)
    illegal = {
        k: sorted(str(p.relative_to(ROOT)) for p in v) for k, v in imported.items() if k not in ALLOWED[pkg]
    }
    assert not illegal, f"rlinf-{pkg} imports packages above it: {illegal}"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_declared_dependencies_match_imports(pkg: str) -> None:
    meta = tomllib.loads((ROOT / "packages" / f"rlinf-{pkg}" / "pyproject.toml").read_text())
    declared = {
        d.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip()
        for d in meta["project"]["dependencies"]
    }
    src = ROOT / "packages" / f"rlinf-{pkg}" / "src" / f"rlinf_{pkg}"
    for other in _workspace_imports(src):
        if other != pkg:
            assert f"rlinf-{other}" in declared, f"rlinf-{pkg} imports rlinf_{other} but does not declare it"
    for dep in declared:
        if dep.startswith("rlinf-"):
            assert dep.removeprefix("rlinf-") in ALLOWED[pkg], (
                f"rlinf-{pkg} declares {dep} against docs/architecture.md"
            )
            assert meta["tool"]["uv"]["sources"][dep] == {"workspace": True}


@pytest.mark.parametrize("pkg", PACKAGES)
def test_package_shape(pkg: str) -> None:
    base = ROOT / "packages" / f"rlinf-{pkg}"
    for rel in [
        "pyproject.toml",
        "README.md",
        f"src/rlinf_{pkg}/__init__.py",
        f"src/rlinf_{pkg}/py.typed",
        "tests",
    ]:
        assert (base / rel).exists(), f"rlinf-{pkg} is missing {rel}"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_import_has_no_side_effects(pkg: str) -> None:
    code = f"""
import logging, os, sys
if "{pkg}" in ("scheduler", "runners"):
    import ray  # ray's own import sets RAY_CLIENT_MODE; only what rlinf_scheduler adds on top counts
env = dict(os.environ); handlers = list(logging.getLogger().handlers); level = logging.getLogger().level
import rlinf_{pkg}
assert dict(os.environ) == env, "import changed os.environ"
assert logging.getLogger().handlers == handlers and logging.getLogger().level == level, "import configured logging"
assert "ray" not in sys.modules or "{pkg}" in ("scheduler", "runners"), "import pulled in ray"
assert "omegaconf" not in sys.modules
print(rlinf_{pkg}.__version__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_algos_imports_nothing_heavy() -> None:
    code = "import sys, rlinf_algos; bad = {'torch', 'ray', 'omegaconf', 'numpy'} & set(sys.modules); assert not bad, bad"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def _tool(name: str) -> str:
    exe = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed in the test environment (dependency group 'lint')")
    return exe


def test_ruff_clean() -> None:
    out = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(
        [_tool("ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    """Strict mypy over the packages listed under `[tool.mypy]` in the root pyproject.toml."""
    out = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
