"""Worker: its place in each named device mesh, as nd-compute dispatch asks for it (no Ray)."""

from __future__ import annotations

import pytest

from hyflow.controller import ControllerUsageError, Worker


@pytest.fixture
def rank_zero_of_two(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}.items():
        monkeypatch.setenv(key, value)


def test_a_worker_answers_its_dp_rank_and_collect_flag_per_mesh(rank_zero_of_two):
    worker = Worker()
    worker._register_dispatch_collect_info(mesh_name="train", dp_rank=1, is_collect=False)
    assert worker._query_dispatch_info("train") == 1
    assert worker._query_collect_info("train") is False


def test_a_worker_holding_several_roles_copies_each_role_record_under_its_own_mesh_name(rank_zero_of_two):
    ref, actor, hybrid = Worker(), Worker(), Worker()
    ref._register_dispatch_collect_info(mesh_name="actor", dp_rank=0, is_collect=True)
    actor._register_dispatch_collect_info(mesh_name="actor", dp_rank=1, is_collect=False)
    hybrid.set_dispatch_collect(mesh_name="ref", **ref.get_dispatch_collect())
    hybrid.set_dispatch_collect(mesh_name="actor", **actor.get_dispatch_collect())
    assert (hybrid._query_dispatch_info("ref"), hybrid._query_collect_info("ref")) == (0, True)
    assert (hybrid._query_dispatch_info("actor"), hybrid._query_collect_info("actor")) == (1, False)


def test_registering_a_mesh_twice_is_refused_as_verl_asserts(rank_zero_of_two):
    worker = Worker()
    worker._register_dispatch_collect_info(mesh_name="train", dp_rank=0, is_collect=True)
    with pytest.raises(ControllerUsageError, match="mesh 'train' is registered already") as raised:
        worker._register_dispatch_collect_info(mesh_name="train", dp_rank=1, is_collect=True)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, AssertionError)


def test_asking_for_an_unregistered_mesh_names_the_registered_ones(rank_zero_of_two):
    worker = Worker()
    worker._register_dispatch_collect_info(mesh_name="train", dp_rank=0, is_collect=True)
    with pytest.raises(ControllerUsageError, match=r"has no mesh 'infer' \(registered: \['train'\]\)"):
        worker._query_dispatch_info("infer")
