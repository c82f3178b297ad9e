"""DAPO dynamic sampling: zero-variance groups dropped, kept groups accumulated, trimmed, and the limit enforced."""

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.config import PPOTrainerConfig
from hyflow.protocol import DataProto
from hyflow.trainer.dynamic_sampling import GroupFilter, filter_groups, group_metric_values


def _batch(group_scores: list[list[float]], prefix: str = "g") -> DataProto:
    """One group per inner list (its n scores), rows interleaved as rollout.n repetition makes them."""
    rows = [(f"{prefix}{g}", score) for g, scores in enumerate(group_scores) for score in scores]
    uids = np.array([uid for uid, _ in rows], dtype=object)
    scores = torch.zeros(len(rows), 3)
    scores[:, -1] = torch.tensor([score for _, score in rows])
    acc = np.array([score > 0.5 for _, score in rows], dtype=object)
    return DataProto.from_dict({F.TOKEN_LEVEL_SCORES: scores}, {F.UID: uids, "acc": acc})


def test_groups_whose_samples_all_score_the_same_are_dropped():
    data = _batch([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.2, 0.0]])
    kept, num_kept, num_groups = filter_groups(data, "seq_reward")
    assert (num_kept, num_groups) == (2, 4)
    assert list(kept.non_tensor_batch[F.UID]) == ["g1", "g1", "g3", "g3"]


def test_the_metric_can_be_a_per_row_value_from_the_reward_function():
    data = _batch([[0.2, 0.0], [0.9, 0.0]])
    kept, num_kept, _ = filter_groups(data, "acc")  # acc is False, False in the first group
    assert num_kept == 1
    assert list(kept.non_tensor_batch[F.UID]) == ["g1", "g1"]


def test_a_group_of_one_sample_is_kept():
    kept, num_kept, _ = filter_groups(_batch([[1.0]]), "seq_reward")
    assert num_kept == 1 and len(kept) == 1


def test_unknown_metric_lists_the_available_ones():
    with pytest.raises(ValueError, match="'acc'"):
        group_metric_values(_batch([[1.0, 0.0]]), "accuracy")


def test_filter_accumulates_groups_over_generation_batches_and_trims_to_the_batch_size():
    sampler = GroupFilter(metric="seq_reward", train_batch_size=3, n=2, max_num_gen_batches=5)
    assert sampler.add(_batch([[1.0, 1.0], [0.0, 1.0]], prefix="a")) is None
    full = sampler.add(_batch([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.5, 0.0]], prefix="b"))
    assert full is not None
    assert list(full.non_tensor_batch[F.UID]) == ["a1", "a1", "b0", "b0", "b2", "b2"]
    assert sampler.last_metrics["train/num_gen_batches"] == 2.0
    assert sampler.last_metrics["train/kept_group_ratio"] == pytest.approx(4 / 6)
    # the filter starts over for the next training batch
    assert sampler.add(_batch([[0.0, 1.0]], prefix="c")) is None


def test_reaching_max_num_gen_batches_with_too_few_groups_says_what_to_change():
    sampler = GroupFilter(metric="seq_reward", train_batch_size=4, n=2, max_num_gen_batches=2)
    assert sampler.add(_batch([[1.0, 1.0], [0.0, 1.0]])) is None
    with pytest.raises(ValueError, match=r"found only 1 of data\.train_batch_size=4 groups.*max_num_gen_batches=2"):
        sampler.add(_batch([[0.0, 0.0]]))


def test_zero_max_num_gen_batches_means_no_limit():
    sampler = GroupFilter(metric="seq_reward", train_batch_size=1, n=2, max_num_gen_batches=0)
    for _ in range(5):
        assert sampler.add(_batch([[1.0, 1.0]])) is None
    assert sampler.add(_batch([[1.0, 0.0]])) is not None


def test_the_trainers_group_filter_exists_only_when_filter_groups_is_enabled():
    config = PPOTrainerConfig()
    assert GroupFilter.from_config(config) is None
    config.algorithm.filter_groups.enable = True
    config.data.train_batch_size, config.actor_rollout_ref.rollout.n = 6, 4
    group_filter = GroupFilter.from_config(config)
    assert (group_filter.train_batch_size, group_filter.n) == (6, 4)
    assert group_filter.metric == config.algorithm.filter_groups.metric
