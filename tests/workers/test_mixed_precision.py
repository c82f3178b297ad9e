"""One rank without FSDP2 (mixed_precision.py): bf16 compute copies cast once per step give FSDP2's one-rank
mixed-precision update exactly (log-probs, metrics, fp32 weights after two steps), and hand the fp32 weights and
gradients back after the step."""

import copy

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.models.loader import load_causal_lm
from hyflow.models.policy import PolicyModel
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.fsdp import iter_full_state
from hyflow.workers.mixed_precision import SingleRankMixedPrecision
from hyflow.workers.optim import build_optimizer, clip_grad_norm_and_step

from .conftest import make_ppo_batch
from .distributed import run_ranks

ROWS = 8


def update_twice(rank: int, path: str, data, fsdp2: bool):
    """Log-probs, then two updates (2 mini-batches of 2 micro-batches each) of a bf16-compute / fp32-master actor
    on one rank: through FSDP2's root wrapping (the path before) or `SingleRankMixedPrecision`."""
    config = ActorConfig(ppo_epochs=2, ppo_micro_batch_size_per_gpu=2, use_kl_loss=True, entropy_coeff=0.01)
    config.optim.lr = 1e-2
    torch.manual_seed(0)
    policy = PolicyModel(load_causal_lm(path), chunk_size=5)
    if fsdp2:
        policy_mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(policy, reshard_after_forward=False, mp_policy=policy_mp)
    else:
        policy.single_rank_precision = SingleRankMixedPrecision(policy, torch.bfloat16, torch.float32)
    actor = DataParallelPPOActor(config, policy, build_optimizer(policy.parameters(), config.optim), ROWS // 2)
    log_probs, _ = actor.compute_log_prob(copy.deepcopy(data))
    metrics = [actor.update_policy(copy.deepcopy(data)) for _ in range(2)]
    state = {name: tensor.clone() for name, tensor in iter_full_state(actor.module)}
    return log_probs, metrics, state


def both_paths(rank: int, path: str, data):
    return update_twice(rank, path, data, fsdp2=True), update_twice(rank, path, data, fsdp2=False)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_bf16_compute_copies_give_fsdp2_one_rank_mixed_precision_update_exactly(tiny_model_path):
    data = make_ppo_batch(batch_size=ROWS, seed=11)
    [(fsdp2, single)] = run_ranks(both_paths, 1, tiny_model_path, data)
    assert torch.equal(single[0], fsdp2[0])
    assert single[1] == fsdp2[1]  # every metric of both updates
    assert set(single[2]) == set(fsdp2[2])
    for name, value in single[2].items():
        assert value.dtype == torch.float32 and torch.equal(value, fsdp2[2][name]), name


def test_the_copies_are_bf16_only_from_the_first_forward_to_reshard_and_gradients_come_back_in_fp32():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = copy.deepcopy(model).to(torch.bfloat16)  # what the step computes with
    precision = SingleRankMixedPrecision(model, torch.bfloat16, torch.float32)
    masters = [p.data_ptr() for p in model.parameters()]
    x = torch.randn(5, 4)
    for _ in range(2):  # two micro-batches accumulate
        out = model(x)  # the fp32 input is cast too (FSDP2's cast_forward_inputs)
        assert out.dtype == torch.bfloat16 and model.weight.dtype == torch.bfloat16 and precision.unsharded
        assert torch.equal(out, reference(x.to(torch.bfloat16)))
        out.float().sum().backward()
        assert model.weight.grad is None  # held by the accumulator, in fp32
    precision.reshard()
    assert not precision.unsharded and model.weight.dtype == torch.float32
    assert [p.data_ptr() for p in model.parameters()] == masters  # the same fp32 storage, the copies dropped
    reference(x.to(torch.bfloat16)).float().sum().backward()
    for param, ref in zip(model.parameters(), reference.parameters()):
        grad = ref.grad.float()
        assert param.grad.dtype == torch.float32 and torch.equal(param.grad, grad + grad)


def test_the_guarded_optimizer_step_takes_the_fp32_gradients_back_and_updates_the_fp32_weights():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    model.single_rank_precision = SingleRankMixedPrecision(model, torch.bfloat16, torch.float32)
    before = model.weight.detach().clone()
    model(torch.randn(5, 4)).float().sum().backward()  # a training loop of its own (the SFT trainer's)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grad_norm, skipped = clip_grad_norm_and_step(model, optimizer, grad_clip=1e9)
    assert model.weight.dtype == torch.float32 and skipped.item() == 0 and grad_norm.item() > 0
    assert not torch.equal(model.weight.detach(), before)
