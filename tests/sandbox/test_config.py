"""SandboxConfig: limits are checked when the config is built, with the key and value named."""

import pytest

from hyflow.sandbox import SandboxConfig


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"sandbox": "docker"}, r"sandbox='docker' is not a sandbox kind; use 'bwrap'"),
        ({"time_limit": 0}, r"time_limit=0 must be a positive number"),
        ({"work_dir_mb": -1}, r"work_dir_mb=-1 must be a positive number"),
        ({"max_processes": 1}, r"max_processes=1 must be >= 2"),
    ],
)
def test_bad_limits_name_the_setting_and_the_rule(values, message):
    with pytest.raises(ValueError, match=message):
        SandboxConfig(**values)


def test_cpu_seconds_default_to_the_time_limit_rounded_up_plus_one():
    assert SandboxConfig(time_limit=2.5).cpu_seconds == 4
    assert SandboxConfig(time_limit=2.5, cpu_time_limit=1.2).cpu_seconds == 2
