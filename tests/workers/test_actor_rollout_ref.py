"""ActorRolloutRefWorker and CriticWorker through a LocalWorkerGroup (one process, world size 1)."""

import asyncio
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import ActorRolloutRefConfig
from hyflow.config.critic import CriticConfig
from hyflow.controller import ClassWithInitArgs, LocalWorkerGroup
from hyflow.controller.errors import WorkerError
from hyflow.protocol import DataProto
from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker
from hyflow.workers.critic_worker import CriticWorker

from ..engine.engine_testkit import pause_after_steps, rescore
from ..rollout.rollout_testkit import prompt_batch


def actor_rollout_ref_config(path: str, lora_rank: int = 0) -> ActorRolloutRefConfig:
    config = ActorRolloutRefConfig()
    config.model.path = path
    config.model.lora_rank = lora_rank
    config.model.lora_alpha = 8
    config.actor.ppo_mini_batch_size = 2
    config.actor.ppo_micro_batch_size_per_gpu = 2
    config.actor.use_kl_loss = True
    config.actor.optim.lr = 1e-2
    config.rollout.n = 2
    config.rollout.prompt_length = 6
    config.rollout.response_length = 5
    config.rollout.log_prob_micro_batch_size_per_gpu = 3
    config.rollout.log_prob_use_dynamic_bsz = False
    config.rollout.log_prob_max_token_len_per_gpu = 1024
    config.rollout.calculate_log_probs = True
    config.rollout.max_num_batched_tokens = 256
    config.ref.log_prob_micro_batch_size_per_gpu = 4
    config.ref.log_prob_use_dynamic_bsz = True
    config.ref.log_prob_max_token_len_per_gpu = 40
    return config


def make_group(config, **roles) -> LocalWorkerGroup:
    group = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, config, **roles))
    group.init_model()
    return group


@pytest.mark.timeout(300)
def test_worker_computes_log_probs_updates_the_actor_and_keeps_the_ref_fixed(tiny_model_path, ppo_batch, tmp_path):
    group = make_group(actor_rollout_ref_config(tiny_model_path), rollout=False, ref=True)
    data = ppo_batch(batch_size=8, seed=0)
    before = group.compute_log_prob(copy.deepcopy(data))
    ref_before = group.compute_ref_log_prob(copy.deepcopy(data)).batch[F.REF_LOG_PROB]
    torch.testing.assert_close(before.batch[F.OLD_LOG_PROBS], ref_before)
    assert before.batch[F.ENTROPYS].shape == data.batch[F.RESPONSES].shape
    output = group.update_actor(copy.deepcopy(data))
    (losses,) = output.meta_info[F.METRICS]["actor/pg_loss"]  # one list per rank
    assert len(losses) == 2  # 8 rows / (2 prompts × n=2) = 2 steps
    after = group.compute_log_prob(copy.deepcopy(data)).batch[F.OLD_LOG_PROBS]
    assert not torch.allclose(after, before.batch[F.OLD_LOG_PROBS])
    torch.testing.assert_close(group.compute_ref_log_prob(copy.deepcopy(data)).batch[F.REF_LOG_PROB], ref_before)

    group.save_checkpoint(str(tmp_path / "actor"), global_step=1)
    group.update_actor(copy.deepcopy(data))
    group.load_checkpoint(str(tmp_path / "actor"))
    torch.testing.assert_close(group.compute_log_prob(copy.deepcopy(data)).batch[F.OLD_LOG_PROBS], after)


@pytest.mark.timeout(300)
def test_lora_trains_only_adapters_and_the_ref_is_the_adapter_disabled(tiny_model_path, ppo_batch):
    group = make_group(actor_rollout_ref_config(tiny_model_path, lora_rank=4), rollout=False, ref=True)
    worker = group.worker
    assert worker.ref is worker.actor  # no second copy of the weights
    frozen = {n: p.detach().clone() for n, p in worker.actor.module.named_parameters() if not p.requires_grad}
    trainable = {n for n, p in worker.actor.module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    data = ppo_batch(batch_size=8, seed=1)
    ref_before = group.compute_ref_log_prob(copy.deepcopy(data)).batch[F.REF_LOG_PROB]
    group.update_actor(copy.deepcopy(data))
    group.update_actor(copy.deepcopy(data))
    for name, param in worker.actor.module.named_parameters():
        if name in frozen:
            assert torch.equal(param.detach(), frozen[name]), name
    after = group.compute_log_prob(copy.deepcopy(data)).batch[F.OLD_LOG_PROBS]
    assert not torch.allclose(after, ref_before)
    torch.testing.assert_close(group.compute_ref_log_prob(copy.deepcopy(data)).batch[F.REF_LOG_PROB], ref_before)


@pytest.mark.timeout(300)
def test_lora_starts_from_a_saved_adapter_with_the_adapters_own_settings(tiny_model_path, ppo_batch, tmp_path):
    from hyflow.models.loader import load_causal_lm
    from hyflow.models.lora import apply_lora

    saved = apply_lora(load_causal_lm(tiny_model_path), lora_rank=2, lora_alpha=4, target_modules=["v_proj"])
    torch.manual_seed(0)
    for name, param in saved.named_parameters():
        if "lora_B" in name:
            param.data.normal_()
    saved.save_pretrained(tmp_path / "adapter")
    config = actor_rollout_ref_config(tiny_model_path)  # lora_rank=0: the adapter decides
    config.model.lora_adapter_path = str(tmp_path / "adapter")

    group = make_group(config, rollout=False, ref=True)

    model = group.worker.config.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (2, 4, ["v_proj"])
    assert group.worker.ref is group.worker.actor  # the ref is the base model: the adapter switched off
    data = ppo_batch(batch_size=8, seed=2)
    actor = group.compute_log_prob(copy.deepcopy(data)).batch[F.OLD_LOG_PROBS]
    ref = group.compute_ref_log_prob(copy.deepcopy(data)).batch[F.REF_LOG_PROB]
    assert not torch.allclose(actor, ref)  # the saved adapter is active from the first step


@pytest.mark.timeout(300)
def test_generation_uses_the_updated_actor_weights(tiny_model_path, ppo_batch):
    pytest.importorskip("hyflow.rollout.worker_rollout")
    group = make_group(actor_rollout_ref_config(tiny_model_path, lora_rank=4), rollout=True)
    train = ppo_batch(batch_size=8, seed=2)
    group.update_actor(copy.deepcopy(train))
    prompts = train.select(batch_keys=[F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS])[:4]
    prompts = DataProto.from_dict(
        {k: v[:, :6] for k, v in prompts.batch.items()}, meta_info={F.TEMPERATURE: 1.0, F.DO_SAMPLE: True}
    )
    generated = group.generate_sequences(prompts)
    assert generated.batch[F.RESPONSES].shape == (4, 5)
    recomputed = group.compute_log_prob(copy.deepcopy(generated)).batch[F.OLD_LOG_PROBS]
    mask = generated.batch[F.RESPONSE_MASK].bool()
    torch.testing.assert_close(recomputed[mask], generated.batch[F.ROLLOUT_LOG_PROBS][mask], rtol=1e-3, atol=1e-3)
    (synced,) = generated.meta_info[F.METRICS]["rollout/weight_sync_gb"]  # one rank
    assert synced > 0 and generated.meta_info[F.METRICS]["rollout/weight_sync_buckets"] == [0]  # one rank: no gather
    assert generated.meta_info[F.TIMING]["gen/weight_sync"] > 0
    again = group.generate_sequences(prompts)  # no update since: the engine holds the weights already
    assert "rollout/weight_sync_gb" not in again.meta_info[F.METRICS]


def test_a_method_of_a_missing_role_says_which_role_is_missing(tiny_model_path, ppo_batch):
    group = make_group(actor_rollout_ref_config(tiny_model_path), rollout=False, ref=False)
    with pytest.raises(WorkerError, match="needs the ref role"):
        group.compute_ref_log_prob(ppo_batch(batch_size=2))


@pytest.mark.timeout(300)
def test_critic_worker_computes_values_and_updates(tiny_model_path, ppo_batch, tmp_path):
    config = CriticConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, ppo_epochs=1, shuffle=False)
    config.model.path = tiny_model_path
    config.model.tokenizer_path = tiny_model_path
    config.loss_agg_mode = "token-mean"
    config.use_dynamic_bsz = False
    group = LocalWorkerGroup(ClassWithInitArgs(CriticWorker, config, rollout_n=2))
    group.init_model()
    data = ppo_batch(batch_size=4, seed=3)
    values = group.compute_values(copy.deepcopy(data)).batch[F.VALUES]
    assert values.shape == (4, 5)
    metrics = group.update_critic(copy.deepcopy(data)).meta_info[F.METRICS]
    assert len(metrics["critic/vf_loss"]) == 1
    assert not torch.equal(group.compute_values(copy.deepcopy(data)).batch[F.VALUES], values)
    group.save_checkpoint(str(tmp_path / "critic"), global_step=1)


@pytest.mark.timeout(300)
def test_the_log_prob_pass_takes_its_settings_from_the_workers_config_not_from_the_batch(tiny_model_path, ppo_batch):
    from hyflow.workers.micro_batch_loop import ForwardSettings

    config = actor_rollout_ref_config(tiny_model_path)
    config.rollout.temperature = 0.5
    group = make_group(config, rollout=False)
    data = ppo_batch(batch_size=4, seed=3)
    data.meta_info[F.TEMPERATURE] = 1.0  # e.g. left there by a generation call: not the log-prob pass's business

    got = group.compute_log_prob(copy.deepcopy(data)).batch[F.OLD_LOG_PROBS]

    actor = group.worker.actor
    expected, _ = actor.compute_log_prob(copy.deepcopy(data), ForwardSettings(micro_batch_size=3, temperature=0.5))
    torch.testing.assert_close(got, expected)
    at_one, _ = actor.compute_log_prob(copy.deepcopy(data), ForwardSettings(temperature=1.0))
    assert not torch.allclose(got, at_one)


@pytest.mark.timeout(300)
def test_a_rollout_worker_takes_weights_in_flight_and_its_rows_record_both_versions(tiny_model_path):
    config = actor_rollout_ref_config(tiny_model_path)
    config.rollout.response_length = 10
    worker = make_group(config, actor=False, rollout=True).worker  # a rollout-only worker, as in a split placement
    old = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    new = copy.deepcopy(old)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(torch.randn_like(param) * 0.05 * param.std())
    prompts = [[5, 9, 13, 17], [11, 4, 8]]
    pause_after_steps(worker.rollout.engine, 2)

    async def main():
        generating = asyncio.create_task(worker.generate_sequences_async(prompt_batch(prompts, seed=1)))
        while not worker.rollout.engine.paused:  # it pauses itself after its second step
            await asyncio.sleep(0.001)
        metrics = await worker.update_rollout_weights_in_flight(list(new.state_dict().items()), policy_version=5)
        return await generating, metrics

    out, metrics = asyncio.run(main())
    assert metrics["rollout/policy_version"] == 5.0
    mask = out.batch[F.RESPONSE_MASK].bool()
    for i, prompt in enumerate(prompts):
        versions = out.batch[F.ROLLOUT_POLICY_VERSIONS][i][mask[i]].tolist()
        cut = versions.count(0)
        assert versions == [0] * cut + [5] * (len(versions) - cut) and 0 < cut < len(versions)
        tokens = out.batch[F.RESPONSES][i][mask[i]].tolist()
        expected, _ = rescore({0: old, 1: new}, prompt, tokens, [int(v == 5) for v in versions])
        torch.testing.assert_close(out.batch[F.ROLLOUT_LOG_PROBS][i][mask[i]], expected, atol=1e-4, rtol=1e-4)


class RecordingChannel:
    """What a weight channel's sender is handed, kept for the test to look at."""

    def __init__(self):
        self.sent: list[tuple[str, torch.Tensor]] = []

    def send(self, weights, bucket_bytes):
        from hyflow.workers.weight_sync import SyncStats

        self.sent = [(name, tensor.clone()) for name, tensor in weights]
        return SyncStats(num_bytes=sum(t.nbytes for _, t in self.sent), num_tensors=len(self.sent), num_buckets=1)


def test_a_training_worker_sends_the_rollout_pool_its_weights_in_the_engines_dtype(tiny_model_path, monkeypatch):
    import hyflow.rollout.worker_rollout as worker_rollout

    worker = make_group(actor_rollout_ref_config(tiny_model_path), rollout=False).worker  # a split placement's trainer
    worker._channel = channel = RecordingChannel()
    full = dict(worker.actor_weights())
    monkeypatch.setattr(worker_rollout, "engine_dtype", lambda config: "bfloat16")  # what a CUDA engine holds

    metrics = worker.send_weights()

    assert [name for name, _ in channel.sent] == list(full)
    for name, tensor in channel.sent:
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, full[name].to(torch.bfloat16)), name
    fp32_bytes = sum(t.nbytes for t in full.values())
    assert metrics["rollout/weight_transfer_gb"] == pytest.approx(fp32_bytes / 2 / 1e9)  # half the master's bytes
