"""FSDP2 on 2 gloo ranks: the same log-probs and update as one process (with CPU offload, with dynamic bsz), and
sharded checkpoints that resume exactly."""

import copy

import pytest
import torch

from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.config.common import FSDPConfig
from hyflow.models.loader import load_causal_lm
from hyflow.models.policy import PolicyModel
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.checkpoint import ShardCheckpointer
from hyflow.workers.fsdp import (
    apply_fsdp2,
    build_device_mesh,
    full_tensor,
    iter_full_state,
    set_gradient_accumulation,
)
from hyflow.workers.optim import build_optimizer

from .conftest import make_ppo_batch
from .distributed import run_ranks

ROWS = 8


def make_actor(path: str, rows_per_rank: int, offload: bool = False, dynamic: bool = False) -> DataParallelPPOActor:
    config = ActorConfig(ppo_epochs=2, ppo_micro_batch_size_per_gpu=2, use_kl_loss=True, entropy_coeff=0.01)
    config.use_dynamic_bsz, config.ppo_max_token_len_per_gpu = dynamic, 24  # ranks may need different counts
    config.optim.lr = 1e-2
    policy = PolicyModel(load_causal_lm(path), chunk_size=5)
    apply_fsdp2(policy, FSDPConfig(param_offload=offload), build_device_mesh())
    optimizer = build_optimizer(policy.parameters(), config.optim)
    return DataParallelPPOActor(config, policy, optimizer, mini_batch_size=rows_per_rank)


def log_probs_and_update(rank: int, path: str, data, world_size: int, offload: bool = False, dynamic: bool = False):
    shard = data.chunk(world_size)[rank] if world_size > 1 else data
    actor = make_actor(path, ROWS // world_size, offload, dynamic)
    log_probs, _ = actor.compute_log_prob(copy.deepcopy(shard))
    metrics = actor.update_policy(shard)
    params = {name: tensor.clone() for name, tensor in iter_full_state(actor.module)}
    return log_probs, metrics, params


def save_step_then_resume_step(rank: int, path: str, data, checkpoint_dir: str):
    """Sharded save after one update; (metrics, params) of the next update without and with a restart."""
    shard = data.chunk(2)[rank]
    results = []
    for resume in (False, True):
        actor = make_actor(path, ROWS // 2)
        manager = ShardCheckpointer(actor.module, actor.optimizer)
        if resume:
            manager.load(checkpoint_dir)
        else:
            actor.update_policy(copy.deepcopy(shard))
            manager.save(checkpoint_dir)
        metrics = actor.update_policy(copy.deepcopy(shard))
        results.append((metrics, {name: tensor.clone() for name, tensor in iter_full_state(actor.module)}))
    return results


def two_rank_runs(rank: int, path: str, data, checkpoint_dir: str):
    settings = [(False, False), (True, False), (False, True)]  # (offload, dynamic bsz)
    updates = [log_probs_and_update(rank, path, data, 2, offload, dynamic) for offload, dynamic in settings]
    return updates, save_step_then_resume_step(rank, path, data, checkpoint_dir)


@pytest.fixture(scope="module")
def two_rank_results(tiny_model_path, tmp_path_factory):
    data = make_ppo_batch(batch_size=ROWS, seed=11)
    checkpoint_dir = str(tmp_path_factory.mktemp("fsdp_ckpt") / "actor")
    return data, run_ranks(two_rank_runs, 2, tiny_model_path, data, checkpoint_dir)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_two_rank_fsdp_update_equals_one_rank_update_with_offload_or_dynamic_bsz(tiny_model_path, two_rank_results):
    data, results = two_rank_results
    single_log_probs, single_metrics, single_params = log_probs_and_update(0, tiny_model_path, data, 1)
    per_rank = [updates for updates, _ in results]
    for setting in (0, 1, 2):
        (lp0, metrics, params), (lp1, metrics_rank1, _) = per_rank[0][setting], per_rank[1][setting]
        torch.testing.assert_close(torch.cat([lp0, lp1]), single_log_probs, rtol=1e-5, atol=1e-5)
        assert metrics == metrics_rank1  # metrics are reduced over ranks
        for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac"):
            assert metrics[name] == pytest.approx(single_metrics[name], rel=1e-4, abs=1e-6), name
        assert set(params) == set(single_params)
        for name, value in params.items():
            torch.testing.assert_close(value, single_params[name], rtol=1e-4, atol=1e-4, msg=name)  # Adam, lr 1e-2
    offloaded_params = per_rank[0][1][2]
    for name, value in per_rank[0][0][2].items():
        torch.testing.assert_close(offloaded_params[name], value, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_two_rank_sharded_checkpoint_resumes_to_the_same_next_step(two_rank_results):
    _, results = two_rank_results
    for _, ((metrics, params), (resumed_metrics, resumed_params)) in results:
        assert resumed_metrics == metrics
        for name, value in params.items():
            assert torch.equal(resumed_params[name], value), name


def one_rank_update_and_accumulation_flags(rank: int, path: str, data):
    """The update on one FSDP2 rank, FSDP's (reduce, reshard-after-backward) flags of the root before a middle and
    before the last micro-batch's backward, and whether the weight sync's `full_tensor` shares the local storage."""
    result = log_probs_and_update(rank, path, data, 1)
    module = make_actor(path, ROWS).module
    flags = []
    for is_last in (False, True):
        set_gradient_accumulation(module, is_last_micro_batch=is_last)
        flags.append([(g.reduce_grads, g.reshard_after_backward) for g in module._get_fsdp_state()._fsdp_param_groups])
    param = next(module.parameters())
    return result, flags, full_tensor(param).data_ptr() == param.to_local().data_ptr()


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_one_rank_fsdp_accumulates_micro_batches_without_resharding_to_the_same_update(tiny_model_path):
    """On one rank, gradients are reduced and parameters resharded after the last micro-batch only."""
    data = make_ppo_batch(batch_size=ROWS, seed=11)
    single_log_probs, single_metrics, single_params = log_probs_and_update(0, tiny_model_path, data, 1)
    [(result, flags, shares_storage)] = run_ranks(one_rank_update_and_accumulation_flags, 1, tiny_model_path, data)
    log_probs, metrics, params = result
    torch.testing.assert_close(log_probs, single_log_probs, rtol=1e-5, atol=1e-5)
    for name in ("actor/pg_loss", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(single_metrics[name], rel=1e-4, abs=1e-6), name
    for name, value in params.items():
        torch.testing.assert_close(value, single_params[name], rtol=1e-4, atol=1e-4, msg=name)
    middle, last = flags
    assert middle and all(flag == (False, False) for flag in middle)  # no reduce, parameters stay gathered
    assert all(flag == (True, True) for flag in last)
    assert shares_storage  # one rank: the weight sync reads the local shard, no collective, no copy
