"""On Ray, the async trainer's calls to a rollout worker: a non-blocking `generate_sequences_async` and, while it
runs, `update_rollout_weights_in_flight` (async methods make the worker an async actor, so both run at once)."""

from __future__ import annotations

import asyncio
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyflow import fields as F
from hyflow.controller import Dispatch, register
from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker

from ..engine.engine_testkit import pause_after_steps, rescore
from ..rollout.rollout_testkit import prompt_batch
from .test_actor_rollout_ref import actor_rollout_ref_config

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]


class SelfPausingRolloutWorker(ActorRolloutRefWorker):
    """A rollout worker whose engine pauses itself after its second step, and whose weight update waits for that:
    the update lands on a known step boundary. Were the actor's calls not concurrent, neither would return."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        super().init_model()
        pause_after_steps(self.rollout.engine, 2)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def update_rollout_weights_in_flight(self, weights=None, policy_version=None) -> dict[str, float]:
        while not self.rollout.engine.paused:  # the batch generating meanwhile reaches its second step
            await asyncio.sleep(0.001)
        return await super().update_rollout_weights_in_flight(weights, policy_version)


def test_a_weight_update_reaches_a_batch_that_is_generating_on_a_ray_rollout_worker(tiny_model_path):
    ray = pytest.importorskip("ray")
    from hyflow.config.trainer import RayInitConfig
    from hyflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if not ray.is_initialized():
        init_ray(RayInitConfig(num_cpus=2))
    config = actor_rollout_ref_config(tiny_model_path)
    config.rollout.response_length = 10
    worker = RayClassWithInitArgs(SelfPausingRolloutWorker, config, actor=False, rollout=True)
    group = RayWorkerGroup(RayResourcePool([1], use_gpu=False), worker, timeout_s=120)
    group.init_model()
    old = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    new = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    with torch.no_grad():
        for param in new.parameters():
            param.add_(torch.randn_like(param) * 0.05 * param.std())
    prompts = [[5, 9, 13, 17], [11, 4, 8]]

    future = group.generate_sequences_async(prompt_batch(prompts, seed=1))
    (metrics,) = group.update_rollout_weights_in_flight(list(new.state_dict().items()), policy_version=1)
    out = future.get()

    assert metrics["rollout/policy_version"] == 1.0
    mask = out.batch[F.RESPONSE_MASK].bool()
    for i, prompt in enumerate(prompts):
        versions = out.batch[F.ROLLOUT_POLICY_VERSIONS][i][mask[i]].tolist()
        cut = versions.count(0)
        assert versions == [0] * cut + [1] * (len(versions) - cut) and 0 < cut < len(versions)
        tokens = out.batch[F.RESPONSES][i][mask[i]].tolist()
        expected, _ = rescore({0: old, 1: new}, prompt, tokens, versions)
        torch.testing.assert_close(out.batch[F.ROLLOUT_LOG_PROBS][i][mask[i]], expected, atol=1e-4, rtol=1e-4)
