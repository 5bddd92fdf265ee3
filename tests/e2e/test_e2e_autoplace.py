"""End to end: ``rlinf-autoplace`` profiles a real config on real worker groups, then ranks the placements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlinf_runners.autoplace import main

from .conftest import APP_DIR, SMALL

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("slots", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["one-slot", "two-slots"])
def test_autoplace_profiles_cartpole_and_prints_a_placement_the_app_accepts(
    slots: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One slot: one profiling run, the model fitted from it; two slots (slow): both profiling runs."""
    from rlinf_runners.apps import EmbodiedApp

    # SMALL's runner keys are replaced by the profiling runs' own; its env / actor sizes keep the steps short
    overrides = [o for o in SMALL if not o.startswith("runner.")]
    out = tmp_path / "ranking.json"
    argv = [
        str(APP_DIR / "config" / "cartpole_ppo.yaml"),
        *overrides,
        "--nodes",
        "1",
        "--accelerators-per-node",
        str(slots),
        "--profile-steps",
        "2",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # the profiling runs were read back: one slot, then the most slots of the node the config accepts
    assert printed.count("profiled ") == slots and "(1 stage): " in printed
    ranking = json.loads(out.read_text())
    assert ranking and [r["predicted_step_s"] for r in ranking] == sorted(
        r["predicted_step_s"] for r in ranking
    )
    assert all(r["predicted_step_s"] > 0 for r in ranking)
    # the best placement loads and passes the app's checks with its overrides, as a user would paste it
    app = EmbodiedApp(APP_DIR)
    cfg = app.load_config(APP_DIR / "config" / "cartpole_ppo.yaml", [*overrides, *ranking[0]["overrides"]])
    app.check(cfg, app.world_sizes(cfg))
    assert dict(cfg.cluster.component_placement) == ranking[0]["component_placement"]
