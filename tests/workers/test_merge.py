"""`hyflow merge`: checkpoints become Hugging Face folders; LoRA adapters are folded into the weights."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyflow import fields as F
from hyflow.cli import main as hyflow_main
from hyflow.controller import ClassWithInitArgs, LocalWorkerGroup
from hyflow.models.loader import load_value_model
from hyflow.models.lora import merged_hf_weights
from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker
from hyflow.workers.critic_worker import CriticWorker
from hyflow.workers.fsdp import iter_full_state

from .test_actor_rollout_ref import actor_rollout_ref_config


def log_probs_of(model, data):
    batch = data.batch
    logits = model(
        input_ids=batch[F.INPUT_IDS], attention_mask=batch[F.ATTENTION_MASK], position_ids=batch[F.POSITION_IDS]
    ).logits
    response_length = batch[F.RESPONSES].shape[1]
    log_softmax = torch.log_softmax(logits[:, -response_length - 1 : -1].float(), dim=-1)
    log_probs = log_softmax.gather(-1, batch[F.RESPONSES].unsqueeze(-1)).squeeze(-1)
    return log_probs * batch[F.ATTENTION_MASK][:, -response_length:]  # the engine reports 0 on padding


@pytest.mark.timeout(300)
def test_merge_folds_trained_lora_adapters_into_a_loadable_hf_folder(tiny_model_path, ppo_batch, tmp_path):
    group = LocalWorkerGroup(
        ClassWithInitArgs(ActorRolloutRefWorker, actor_rollout_ref_config(tiny_model_path, lora_rank=4), rollout=False)
    )
    group.init_model()
    data = ppo_batch(batch_size=8, seed=4)
    group.update_actor(copy.deepcopy(data))
    group.update_actor(copy.deepcopy(data))
    expected = group.compute_log_prob(copy.deepcopy(data)).batch[F.OLD_LOG_PROBS]
    group.save_checkpoint(str(tmp_path / "global_step_2" / "actor"), global_step=2)

    assert hyflow_main(["merge", str(tmp_path / "global_step_2"), str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(log_probs_of(merged, data), expected, rtol=1e-4, atol=1e-4)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
        assert not torch.allclose(log_probs_of(base, data), expected)

    # The rollout's view of the weights (folded on the fly) equals the merged folder.
    worker = group.worker
    folded = dict(merged_hf_weights(iter_full_state(worker.actor.module), scaling=8 / 4))
    for name, tensor in merged.state_dict().items():
        if name in folded:
            torch.testing.assert_close(folded[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    assert set(folded) <= set(merged.state_dict())


def test_merge_refuses_an_existing_output_and_an_incomplete_checkpoint_in_one_line(tmp_path, capsys):
    (tmp_path / "ckpt").mkdir()
    assert hyflow_main(["merge", str(tmp_path / "ckpt"), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    assert hyflow_main(["merge", str(tmp_path / "ckpt"), str(tmp_path / "out")]) == 2
    incomplete, existing = capsys.readouterr().err.splitlines()  # one line each, no traceback
    assert incomplete.startswith("hyflow merge: ") and "incomplete" in incomplete
    assert existing.startswith("hyflow merge: output") and "already exists" in existing


@pytest.mark.timeout(300)
def test_merge_writes_a_critic_as_backbone_plus_value_head(tiny_model_path, ppo_batch, tmp_path):
    from hyflow.config.critic import CriticConfig

    config = CriticConfig(ppo_mini_batch_size=2, ppo_epochs=1, shuffle=False, loss_agg_mode="token-mean")
    config.model.path = config.model.tokenizer_path = tiny_model_path
    config.use_dynamic_bsz = False
    config.optim.lr = 1e-2
    group = LocalWorkerGroup(ClassWithInitArgs(CriticWorker, config, rollout_n=2))
    group.init_model()
    data = ppo_batch(batch_size=4, seed=5)
    group.update_critic(copy.deepcopy(data))
    expected = group.compute_values(copy.deepcopy(data)).batch[F.VALUES]
    group.save_checkpoint(str(tmp_path / "critic"))
    hyflow_main(["merge", str(tmp_path / "critic"), str(tmp_path / "merged")])
    critic = load_value_model(tmp_path / "merged")
    batch = data.batch
    with torch.no_grad():
        values = critic(batch[F.INPUT_IDS], batch[F.ATTENTION_MASK], batch[F.POSITION_IDS])[:, -6:-1]
    torch.testing.assert_close(values * batch[F.RESPONSE_MASK], expected, rtol=1e-4, atol=1e-5)
