"""``rlinf_runners.cli.main``: parsing, ``--print-config``, exit codes and the report, without starting Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlinf_core.checkpoint import CheckpointError
from rlinf_runners import RunResult, apps, cli
from rlinf_runners.apps import EmbodiedApp, ReasoningApp
from rlinf_scheduler import SchedulerTimeoutError


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A minimal embodied app directory: ``config/cartpole_ppo.yaml`` (the default name) and a second config."""
    (tmp_path / "config").mkdir()
    log = tmp_path / "run"
    (tmp_path / "config" / "cartpole_ppo.yaml").write_text(
        f"runner:\n  max_epochs: 3\n  logger:\n    log_path: {log}\n    logger_backends: []\n"
    )
    (tmp_path / "config" / "other.yaml").write_text("runner:\n  max_epochs: 5\n")
    return tmp_path


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to start a cluster."""

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(apps._app, "Cluster", refuse)


def test_print_config_exits_0_without_starting_ray(
    app_dir: Path, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main("embodied", ["--print-config", "runner.max_epochs=7"], app_dir=app_dir) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["runner"]["max_epochs"] == 7 and printed["env"]["train"]["env_id"] == "CartPole-v1"
    assert cli.main(EmbodiedApp(app_dir), ["--config-name", "other", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["runner"]["max_epochs"] == 5


def test_help_exits_0(app_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main("embodied", ["--help"], mode="eval", app_dir=app_dir) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: eval.py") and "(default: cartpole_ppo)" in out


def test_bad_config_exits_2_naming_the_key(
    app_dir: Path, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main("embodied", ["runner.max_epochs=-3"], app_dir=app_dir) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "runner.max_epochs: 'max_epochs' must be >= 1: -3" in err
    assert (
        cli.main("embodied", ["env.train.total_num_envs=6", "rollout.pipeline_stage_num=4"], app_dir=app_dir)
        == 2
    )
    assert "env.train.total_num_envs (6) must be a multiple of" in capsys.readouterr().err
    assert cli.main("embodied", ["--config-name", "nope"], app_dir=app_dir) == 2
    assert "available: cartpole_ppo, other" in capsys.readouterr().err
    assert cli.main("embodied", ["--bogus"], app_dir=app_dir) == 2


def test_eval_needs_eval_data_before_anything_starts(
    no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    app = ReasoningApp(Path(__file__).resolve().parents[3] / "apps" / "reasoning")
    overrides = ["data.eval_path=null", "runner.val_check_interval=-1"]
    assert cli.main(app, overrides, mode="eval") == 2
    assert "data.eval_path is not set: nothing to evaluate on" in capsys.readouterr().err


def test_a_missing_checkpoint_fails_before_ray_starts(
    app_dir: Path, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main("embodied", [], mode="eval", app_dir=app_dir) == 1  # resume_dir unset: 'auto', none there
    err = capsys.readouterr().err
    assert "error: the run failed: runner.resume_dir: no complete checkpoint under" in err
    # An explicit path that is not there is a config error (exit 2), found while the config is checked.
    missing = app_dir / "nowhere" / "global_step_3"
    assert cli.main("embodied", [f"runner.resume_dir={missing}"], app_dir=app_dir) == 2
    assert f"runner.resume_dir: {str(missing)!r} does not exist" in capsys.readouterr().err
    with pytest.raises(CheckpointError):
        apps.resolve_checkpoint("auto", app_dir / "run")


def test_a_checkpoint_of_another_model_shape_is_refused_before_ray_starts(
    app_dir: Path, no_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlinf_core.checkpoint import CheckpointManager
    from rlinf_core.config import unstructure_config

    app = EmbodiedApp(app_dir)
    log = app_dir / "run"
    saved = unstructure_config(app.load_config(None, ["actor.model.hidden_sizes=[64,64]"]))
    ckpt = CheckpointManager(log).save(4, {"runner.pkl": b""}, {"config": saved})
    # the same shape resumes (the budget may change); auto finds the checkpoint too
    assert app.load_config(None, ["runner.resume_dir=auto", "actor.model.hidden_sizes=[64,64]"])
    for resume in (str(ckpt), "auto"):
        argv = [f"runner.resume_dir={resume}", "actor.model.hidden_sizes=[32]"]
        assert cli.main(app, argv) == 2
        err = capsys.readouterr().err
        assert "actor.model: the checkpoint" in err and "'hidden_sizes': [64, 64]" in err, err
        assert "'hidden_sizes': [32]" in err
    # evaluating it with another env is refused the same way
    assert cli.main(app, [f"runner.resume_dir={ckpt}", "env.train.env_id=Acrobot-v1"], mode="eval") == 2
    assert "env.train.env_id: the checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("raised", "code", "message"),
    [
        (
            SchedulerTimeoutError("rollout did not answer in 600 s"),
            1,
            "the run failed: rollout did not answer",
        ),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_a_failed_or_interrupted_run_sets_the_exit_code(
    app_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: BaseException,
    code: int,
    message: str,
) -> None:
    def run_app(*_args: Any, **_kwargs: Any) -> Any:
        raise raised

    monkeypatch.setattr(apps, "run_app", run_app)
    assert cli.main("embodied", [], app_dir=app_dir) == code
    assert message in capsys.readouterr().err


def test_train_prints_where_the_results_are(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    log = app_dir / "run"
    log.mkdir()
    (log / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "eval/return_mean": 10.0 * s}) + "\n" for s in range(3))
    )
    checkpoint = log / "checkpoints" / "global_step_2"
    result = RunResult(log, log / "metrics.jsonl", checkpoint, 2, {"eval/return_mean": 20.0})
    seen: list[Any] = []

    def run_app(app: Any, cfg: Any, **kwargs: Any) -> Any:
        seen.append((app, cfg.runner.max_epochs, kwargs))
        return result

    monkeypatch.setattr(apps, "run_app", run_app)
    assert cli.main("embodied", ["runner.max_epochs=2"], app_dir=app_dir) == 0
    assert seen == [(seen[0][0], 2, {})] and isinstance(seen[0][0], EmbodiedApp)
    out = capsys.readouterr().out
    assert "finished 2 training steps; last evaluation: {'eval/return_mean': 20.0}" in out
    assert f"metrics:     {log / 'metrics.jsonl'}" in out and f"checkpoint:  {checkpoint}" in out
    assert f"curves:      {log / 'plots' / 'eval_return_mean.png'}" in out
    assert f"tensorboard: tensorboard --logdir {log}" in out


def test_eval_prints_the_metrics_as_json(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[dict[str, Any]] = []

    def run_app(_app: Any, _cfg: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return {"eval/return_mean": 500.0, "eval/checkpoint_step": 3.0}

    monkeypatch.setattr(apps, "run_app", run_app)
    assert cli.main("embodied", ["runner.resume_dir=auto"], mode="eval", app_dir=app_dir) == 0
    assert calls == [{"evaluate_only": "auto"}]
    assert json.loads(capsys.readouterr().out) == {"eval/return_mean": 500.0, "eval/checkpoint_step": 3.0}
    # runner.resume_dir=none evaluates the policy as the config builds it (fresh, or actor.model.model_path).
    assert cli.main("embodied", ["runner.resume_dir=none"], mode="eval", app_dir=app_dir) == 0
    assert calls[-1] == {"evaluate_only": "none"}
    # In training, "none" is no checkpoint directory.
    assert cli.main("embodied", ["runner.resume_dir=none"], mode="train", app_dir=app_dir) == 2


def test_the_entry_sets_the_ray_variable_before_ray_is_imported(app_dir: Path) -> None:
    # A finder that records the variable at the moment `ray` is first imported (and then lets it load).
    code = f"""
import os, sys
os.environ.pop("RAY_ENABLE_UV_RUN_RUNTIME_ENV", None)
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" and not seen:
            seen.append(os.environ.get("RAY_ENABLE_UV_RUN_RUNTIME_ENV"))
        return None
sys.meta_path.insert(0, Spy())
import rlinf_runners.cli
assert "ray" not in sys.modules, "importing the command line pulled in ray"
assert rlinf_runners.cli.main("embodied", ["--print-config"], app_dir={str(app_dir)!r}) == 0
assert seen == ["0"], seen
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.parametrize("app_name", ["embodied", "reasoning", "agent"])
def test_reading_and_checking_a_config_does_not_import_torch(app_name: str) -> None:
    # The driver reads and checks the config before Ray starts; torch (~1.5 s of CPU here) is only needed in
    # the worker processes, and a driver that imports it competes with their start-up for the same cores.
    root = Path(__file__).resolve().parents[3]
    code = (
        "import sys\n"
        "from rlinf_runners.apps import APPS\n"
        f"app = APPS[{app_name!r}]({str(root / 'apps' / app_name)!r})\n"
        "app.load_config(app.config_dir / (app.default_config + '.yaml'), ['runner.resume_dir=null'])\n"
        "import rlinf_runners.cli\n"
        "assert 'torch' not in sys.modules, 'reading the config imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
