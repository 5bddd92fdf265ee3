"""The agent app's retrieval-service settings are checked before Ray starts (``searchr1_smollm2.yaml``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlinf_core.config import ConfigError
from rlinf_runners.apps import AgentApp

APP_DIR = Path(__file__).resolve().parents[3] / "apps" / "agent"
SEARCHR1 = APP_DIR / "config" / "searchr1_smollm2.yaml"
PLACEMENT = "    actor,rollout,reward,retriever: 0"


def _with_placement(tmp_path: Path, lines: str, accelerators: int = 1) -> Path:
    text = SEARCHR1.read_text(encoding="utf-8")
    assert PLACEMENT in text
    text = text.replace(PLACEMENT, lines).replace(
        "simulated_accelerators_per_node: 1", f"simulated_accelerators_per_node: {accelerators}"
    )
    out = tmp_path / "searchr1.yaml"
    out.write_text(text, encoding="utf-8")
    return out


def test_searchr1_config_loads_collocated_and_disaggregated(tmp_path: Path) -> None:
    app = AgentApp(APP_DIR)
    cfg = app.load_config(SEARCHR1)
    assert cfg.tools.search_backend == "service" and cfg.tools.retriever.type == "bm25"
    assert cfg.reward.kwargs["metric"] == "em"
    assert app.placed_components(cfg) == {"actor", "rollout", "reward", "retriever"}
    assert app.world_sizes(cfg) == {"actor": 1, "rollout": 1, "reward": 1}
    split = _with_placement(tmp_path, "    actor: 0\n    rollout,reward,retriever: 1", accelerators=2)
    assert app.world_sizes(app.load_config(split)) == {"actor": 1, "rollout": 1, "reward": 1}
    assert app.load_config(SEARCHR1, ["reward.kwargs.metric=f1"]).reward.kwargs["metric"] == "f1"


def test_service_mode_without_a_retriever_placement_is_refused(tmp_path: Path) -> None:
    app = AgentApp(APP_DIR)
    with pytest.raises(ConfigError) as err:
        app.load_config(_with_placement(tmp_path, "    actor,rollout,reward: 0"))
    text = str(err.value)
    assert "tools.search_backend is 'service'" in text and "places no 'retriever'" in text
    assert "allowed: local, service" in text


def test_retriever_placed_in_local_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"places 'retriever' but tools\.search_backend is 'local'"):
        AgentApp(APP_DIR).load_config(SEARCHR1, ["tools.search_backend=local"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("tools.search_backend=remote", "tools.search_backend: 'remote' is not one of 'local', 'service'"),
        ("tools.retriever.type=dense", "tools.retriever.type: 'dense' is not one of 'bm25'"),
        ("reward.kwargs.metric=rouge", "reward.kwargs: metric: unknown value 'rouge'; allowed: em, f1"),
        ("tools.enabled=[calculator]", "does not list 'search'"),
    ],
)
def test_bad_values_name_the_field_and_the_allowed_values(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        AgentApp(APP_DIR).load_config(SEARCHR1, [override])
    assert expected in str(err.value)


def test_the_toy_config_keeps_local_search() -> None:
    app = AgentApp(APP_DIR)
    cfg = app.load_config(APP_DIR / "config" / "smollm2_tools.yaml")
    assert cfg.tools.search_backend == "local"
    assert app.placed_components(cfg) == {"actor", "rollout", "reward"}
