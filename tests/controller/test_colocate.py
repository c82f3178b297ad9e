"""Colocated roles: two worker classes fused into one process per rank, reached through spawned role groups."""

from __future__ import annotations

import os

import pytest
import torch

from hyflow.controller import (
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
)
from hyflow.protocol import DataProto

from .sample_workers import ActorRole, AdderRole, CriticRole, HybridWorker


def fused_roles():
    return create_colocated_worker_cls({"actor": RayClassWithInitArgs(ActorRole, step=5), "critic": CriticRole})


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_spawned_ray_role_groups_reach_their_own_role_in_one_shared_process(ray_session):
    wg = RayWorkerGroup(RayResourcePool([2], use_gpu=False), fused_roles())
    groups = wg.spawn(prefix_set={"actor", "critic"})
    actor, critic = groups["actor"], groups["critic"]
    actor_answers, critic_answers = actor.whoami(), critic.whoami()
    assert [role for role, _ in actor_answers] == ["actor", "actor"]
    assert [role for role, _ in critic_answers] == ["critic", "critic"]
    assert [pid for _, pid in actor_answers] == [pid for _, pid in critic_answers] == wg.worker_pids
    assert len(set(wg.worker_pids)) == 2
    out = actor.advance(DataProto.from_dict({"x": torch.arange(4)}))
    assert out.batch["x"].tolist() == [5, 6, 7, 8]
    assert critic.value_of(2.0) == [20.0, 20.0]
    assert not hasattr(critic, "advance") and not hasattr(actor, "value_of")
    wg.kill()


def test_spawned_local_role_groups_share_one_worker_in_this_process():
    wg = LocalWorkerGroup(fused_roles())
    groups = wg.spawn(["actor", "critic"])
    assert groups["actor"].whoami() == [("actor", os.getpid())]
    assert groups["critic"].whoami() == [("critic", os.getpid())]
    assert groups["actor"].worker is groups["critic"].worker is wg.worker
    assert groups["actor"].advance(DataProto.from_dict({"x": torch.zeros(3)})).batch["x"].tolist() == [5.0] * 3


def test_spawn_rejects_a_role_the_group_does_not_have():
    wg = LocalWorkerGroup(fused_roles())
    with pytest.raises(ValueError, match=r"\['reward'\] are not roles of this group"):
        wg.spawn({"reward"})


def test_role_names_that_cannot_prefix_a_method_are_rejected():
    with pytest.raises(ValueError, match="must be a Python identifier"):
        create_colocated_worker_cls({"actor rollout": ActorRole})


def test_a_subclass_of_the_raw_fused_class_chains_its_roles_in_one_process_and_fuse_exposes_each_role():
    wg = LocalWorkerGroup(RayClassWithInitArgs(HybridWorker))
    wg.fuse(["adder", "subtracter"])
    assert wg.adder.add(0.5) == [0.5]
    assert wg.subtracter.sub(0.5) == [-9.5]
    assert wg.add_then_sub(0.5) == [-9.5]
    assert wg.roles_see_each_other() == [True]


def test_the_fused_name_builds_the_same_colocated_worker():
    wg = LocalWorkerGroup(create_colocated_worker_cls_fused({"adder": AdderRole, "critic": CriticRole}))
    groups = wg.spawn(["adder", "critic"])
    assert groups["adder"].add(1.0) == [1.0] and groups["critic"].value_of(1.0) == [10.0]


def test_a_role_named_like_a_worker_attribute_is_refused():
    with pytest.raises(ValueError, match="role name 'rank' is an attribute of every worker"):
        create_colocated_worker_cls({"rank": ActorRole})
