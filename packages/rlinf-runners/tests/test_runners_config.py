from __future__ import annotations

import pytest
from rlinf_core.config import ConfigError, structure_config
from rlinf_runners import RunnerConfig


def test_runner_config_total_steps_and_errors() -> None:
    assert RunnerConfig(max_epochs=10).total_steps == 10
    assert RunnerConfig(max_epochs=10, max_steps=4).total_steps == 4
    with pytest.raises(ConfigError) as err:
        structure_config(
            RunnerConfig,
            {"max_epoch": 3, "save_interval": -2, "logger": {"logger_backends": ["tensorbord"]}},
        )
    text = str(err.value)
    assert "runner.max_epochs" not in text and "'max_epochs'" in text  # the closest valid key
    assert "save_interval" in text and "tensorbord" in text and "tensorboard" in text
