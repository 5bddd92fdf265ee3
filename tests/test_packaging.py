"""Each package builds on its own, and rlinf-algos installs with at most one other distribution."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["algos", "scheduler", "core", "envs", "models", "rollout", "runners"]


def _uv() -> str:
    exe = shutil.which("uv")
    if exe is None:
        pytest.fail("uv is not on PATH; the README's commands need it")
    return exe


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-sources: prove each package builds from its own pyproject, as a user's `uv build --package` would.
    proc = subprocess.run(
        [_uv(), "build", "--all-packages", "--no-sources", "--wheel", "-o", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("pkg", PACKAGES)
def test_package_builds_alone(wheels: Path, pkg: str) -> None:
    found = list(wheels.glob(f"rlinf_{pkg}-*.whl"))
    assert len(found) == 1, f"no wheel for rlinf-{pkg}: {sorted(p.name for p in wheels.iterdir())}"
    names = zipfile.ZipFile(found[0]).namelist()
    assert f"rlinf_{pkg}/py.typed" in names
    assert f"rlinf_{pkg}/__init__.py" in names


def test_algos_wheel_requires_only_array_api_compat(wheels: Path) -> None:
    (whl,) = wheels.glob("rlinf_algos-*.whl")
    with zipfile.ZipFile(whl) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line for line in zf.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    hard = [r for r in requires if "extra ==" not in r]
    assert len(hard) == 1 and "array-api-compat" in hard[0], hard


def test_algos_installs_into_fresh_venv_without_torch(wheels: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([_uv(), "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    (whl,) = wheels.glob("rlinf_algos-*.whl")
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    env.pop("UV_PROJECT_ENVIRONMENT", None)
    proc = subprocess.run(
        [_uv(), "pip", "install", "-q", "--python", str(py), str(whl)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    listed = subprocess.run(
        [_uv(), "pip", "list", "--python", str(py), "--format", "freeze"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    names = sorted(line.split("==")[0].lower() for line in listed)
    assert names == ["array-api-compat", "rlinf-algos"], names
    check = "import rlinf_algos, sys; assert 'torch' not in sys.modules; print(rlinf_algos.__version__)"
    out = subprocess.run([str(py), "-c", check], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
