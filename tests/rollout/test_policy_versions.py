"""The policy versions of a rollout's tokens: packed response-shaped with the row's range, and their metrics."""

from __future__ import annotations

import pytest
import torch

from hyflow import fields as F
from hyflow.rollout.batch import pack_responses
from hyflow.rollout.policy_versions import policy_version_metrics

from .rollout_testkit import PAD, prompt_batch


def test_versions_are_packed_per_token_with_padding_minus_one_and_each_rows_oldest_and_newest():
    out = pack_responses(
        prompt_batch([[5, 6], [7]]),
        [[1, 2, 3], []],
        [[-0.1, -0.2, -0.3], []],
        ["length", "abort"],
        response_length=4,
        pad_token_id=PAD,
        policy_versions=[[3, 3, 4], []],
    )
    assert out.batch[F.ROLLOUT_POLICY_VERSIONS].tolist() == [[3, 3, 4, -1], [-1, -1, -1, -1]]
    assert list(out.non_tensor_batch[F.ROLLOUT_POLICY_VERSION_MIN]) == [3, -1]
    assert list(out.non_tensor_batch[F.ROLLOUT_POLICY_VERSION_MAX]) == [4, -1]


def test_without_versions_the_batch_has_no_version_fields():
    out = pack_responses(prompt_batch([[5]]), [[1]], [[-0.5]], ["length"], 2, PAD)
    assert F.ROLLOUT_POLICY_VERSIONS not in out.batch.keys()  # noqa: SIM118 (TensorDict membership)
    assert F.ROLLOUT_POLICY_VERSION_MIN not in out.non_tensor_batch


def test_metrics_give_the_fraction_of_model_tokens_per_lag_behind_the_current_version():
    versions = torch.tensor([[5, 5, 6, 6], [4, 6, 6, 3]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])  # the last column (version 6 and 3) does not count
    metrics = policy_version_metrics(versions, mask, current_version=6)
    # model tokens: 5 5 6 | 4 6 6  ->  lag 0: 3/6, lag 1: 2/6, lag 2: 1/6
    assert metrics == {
        "rollout/token_fraction_lag_0": pytest.approx(0.5),
        "rollout/token_fraction_lag_1": pytest.approx(2 / 6),
        "rollout/token_fraction_lag_2": pytest.approx(1 / 6),
        "rollout/policy_version_min": 4.0,
        "rollout/policy_version_max": 6.0,
    }
    assert policy_version_metrics(versions, torch.zeros_like(mask), 6) == {}
