"""The SFT config reads its overrides like `hyflow train`: `~` paths, located parse errors, one report."""

import pytest

from hyflow.config import ConfigError, load_sft_config


def test_a_tilde_path_in_an_sft_override_is_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))

    config = load_sft_config(["data.train_files=~/chat/train.parquet", "model.path=~/models/tiny"])

    assert config.data.train_files == f"{tmp_path}/chat/train.parquet"
    assert config.model.path == f"{tmp_path}/models/tiny"


def test_a_malformed_override_and_an_unknown_key_are_reported_together():
    with pytest.raises(ConfigError) as caught:
        load_sft_config(["trainer.experiment_name=a=b", "optim.lrr=1e-5"])

    first, second = caught.value.problems
    assert first.startswith("could not parse `trainer.experiment_name=a=b`") and "'a=b'" in first
    assert "Did you mean 'optim.lr'?" in second
