"""SandboxConfig: limits are checked when the config is built, with the key and value named."""

import pytest

from hyflow.sandbox import SandboxConfig
from hyflow.sandbox.bwrap import namespace_args


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


def test_nested_user_namespaces_are_disabled_as_an_ordinary_user_where_bwrap_knows_how():
    assert "--disable-userns" in namespace_args(as_root=False, options=frozenset({"--disable-userns", "--seccomp"}))
    assert "--disable-userns" not in namespace_args(as_root=False, options=frozenset({"--seccomp"}))


def test_without_a_memory_cgroup_a_call_is_bounded_by_the_documented_product():
    config = SandboxConfig()  # the arithmetic docs/howto/tools.md states for the defaults
    assert (config.max_processes, config.memory_limit_mb, config.work_dir_mb) == (8, 1024, 64)
