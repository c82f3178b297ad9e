"""ScoringPool: results in input order, and settings checked up front."""

import pytest

from hyflow.reward.scorers import default_compute_score
from hyflow.reward.scoring_pool import ScoringPool


@pytest.mark.timeout(60)
def test_outcomes_come_back_in_input_order():
    calls = [
        {"data_source": "arith", "solution_str": f"<answer>{i}</answer>", "ground_truth": str(i % 2)} for i in range(6)
    ]
    pool = ScoringPool(num_processes=2, timeout=30)
    try:
        outcomes = pool.run(default_compute_score, calls)
    finally:
        pool.close()
    assert [o.status for o in outcomes] == ["ok"] * 6
    assert [o.value["acc"] for o in outcomes] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"num_processes": 0, "timeout": 1}, "num_processes"), ({"num_processes": 1, "timeout": 0}, "timeout")],
)
def test_bad_pool_settings_name_the_config_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"reward_model\.{key}"):
        ScoringPool(**kwargs)
