"""FSDP2 with a tiny mixture-of-experts model on 2 gloo ranks: each rank built lean (`build_sharded`: its own
experts read from the per-expert checkpoint into transformers' fused expert parameters), the same shards as a full
load, and the same log-probs, router aux loss, expert load and update as one process."""

import copy

import pytest
import torch

from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.config.common import FSDPConfig, ModelConfig
from hyflow.models.tiny import build_tiny_model
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.builders import policy_maker
from hyflow.workers.fsdp import apply_fsdp2, build_device_mesh, iter_full_state
from hyflow.workers.lean_load import build_sharded
from hyflow.workers.optim import build_optimizer

from .conftest import make_ppo_batch
from .distributed import run_ranks

ROWS = 4


def moe_update(rank: int, path: str, data, world_size: int):
    """(log-probs, metrics, parameters after one step, how the weights were loaded) of this rank's shard."""
    shard = data.chunk(world_size)[rank] if world_size > 1 else data
    # One row per micro-batch: each micro-batch's routing statistics are then the same on 1 and 2 ranks.
    config = ActorConfig(ppo_micro_batch_size_per_gpu=1, router_aux_loss_coef=0.1)
    config.optim.lr = 1e-2
    fsdp_config = FSDPConfig()
    make = policy_maker(ModelConfig(path=path), fsdp_config, path, trainable=True)
    policy, stats = build_sharded(make, path, fsdp_config, build_device_mesh())
    optimizer = build_optimizer(policy.parameters(), config.optim)
    actor = DataParallelPPOActor(config, policy, optimizer, mini_batch_size=ROWS // world_size)
    log_probs, _ = actor.compute_log_prob(copy.deepcopy(shard))
    metrics = actor.update_policy(shard)
    return log_probs, metrics, {name: tensor.clone() for name, tensor in iter_full_state(actor.module)}, stats.mode


def lean_and_full_shards(paths: dict[str, str]):
    """Per family: how the lean build loaded, and its local shards beside those of `from_pretrained` + FSDP2."""
    results = {}
    for arch, path in paths.items():
        make = policy_maker(ModelConfig(path=path), FSDPConfig(), path, trainable=True)
        lean, stats = build_sharded(make, path, FSDPConfig(), build_device_mesh())
        full = apply_fsdp2(make(False)[0], FSDPConfig(), build_device_mesh())
        shards = [{n: p.to_local().detach().clone() for n, p in m.named_parameters()} for m in (lean, full)]
        results[arch] = (stats.mode, *shards)
    return results


def two_rank_runs(rank: int, paths: dict[str, str], data):
    """One spawn for both tests: the qwen3_moe update, and the lean loads of the other families."""
    update = moe_update(rank, paths["qwen3_moe"], data, 2)
    return update, lean_and_full_shards({arch: paths[arch] for arch in ("qwen2_moe", "mixtral")})


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_moe")
    paths = {
        arch: build_tiny_model(root / arch, arch=arch, hidden_size=32) for arch in ("qwen3_moe", "qwen2_moe", "mixtral")
    }
    data = make_ppo_batch(batch_size=ROWS, seed=5)
    return paths, data, run_ranks(two_rank_runs, 2, paths, data)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_two_rank_fsdp_moe_update_equals_one_rank_update(two_rank_results):
    paths, data, results = two_rank_results
    single_log_probs, single_metrics, single_params, _ = moe_update(0, paths["qwen3_moe"], data, 1)
    (lp0, metrics, params, mode), (lp1, metrics_rank1, _, _) = [update for update, _ in results]
    assert mode == "sliced"  # per-expert checkpoint tensors into the fused experts, each rank its own experts
    torch.testing.assert_close(torch.cat([lp0, lp1]), single_log_probs, rtol=1e-5, atol=1e-5)
    assert metrics == metrics_rank1  # reduced over ranks
    for name in ("actor/pg_loss", "actor/router_aux_loss", "actor/grad_norm", "moe/load_imbalance"):
        assert metrics[name] == pytest.approx(single_metrics[name], rel=1e-4, abs=1e-6), name
    assert set(params) == set(single_params)
    for name, value in params.items():
        torch.testing.assert_close(value, single_params[name], rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_lean_load_reads_each_ranks_experts_into_the_fused_parameters_of_every_moe_family(two_rank_results):
    for _, per_arch in two_rank_results[2]:
        for arch, (mode, lean, full) in per_arch.items():
            assert mode == "sliced", arch
            assert any("experts.gate_up_proj" in name for name in lean)
            for name, value in full.items():
                assert torch.equal(lean[name], value), (arch, name)
