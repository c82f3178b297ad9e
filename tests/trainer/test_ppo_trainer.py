"""PPOTrainer end to end on CPU: the tiny model, the synthetic arith task, 2 steps of 4 prompts × 2 samples.

A run takes a few seconds; the reward is a small custom function whose score varies with the response text, so
the random tiny model gets non-zero advantages (the real arith scorer would give it 0 everywhere).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from hyflow import fields as F
from hyflow.algorithms import compute_grpo_outcome_advantage, compute_policy_loss_vanilla
from hyflow.algorithms.registry import register_adv_est, register_policy_loss
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import actor_parameters, build_assets_with_reward, tiny_config, train

pytestmark = pytest.mark.usefixtures("in_tmp_path")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets_with_reward(tmp_path_factory.mktemp("ppo"))


@pytest.mark.timeout(120)
def test_grpo_on_the_local_backend_logs_every_stage_and_changes_the_actor(assets, tmp_path):
    steps, trainer, before = train(assets, tmp_path)

    assert [s["step"] for s in steps] == [1, 2]
    metrics = steps[-1]["data"]
    for key in ["critic/score/mean", "critic/advantages/max", "actor/pg_loss", "actor/grad_norm", "actor/lr",
                "actor/entropy", "response_length/mean", "response_length/clip_ratio", "prompt_length/mean",
                "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor",
                "timing_s/step", "perf/throughput", "training/global_step", "timing_s/gen/rollout_mode",
                "timing_s/gen/generate", "timing_s/gen/trainer_mode", "reward/extra/acc/mean",
                "reward/non_finite_count", "reward/error_count"]:  # fmt: skip
        assert key in metrics, key
    parts = sum(metrics[f"timing_s/gen/{phase}"] for phase in ("rollout_mode", "generate", "trainer_mode"))
    assert parts <= metrics["timing_s/gen"]  # the worker's phases lie within the controller's gen stage
    assert "timing_s/ref" not in metrics and "timing_s/values" not in metrics  # no KL, no critic
    after = actor_parameters(trainer)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert not (tmp_path / "ckpt").exists()  # trainer.save_freq=-1 (the kit's): no checkpoints at all, as in verl


@pytest.mark.timeout(120)
def test_a_run_with_save_freq_minus_one_says_at_its_end_that_it_saved_no_checkpoint(assets, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="hyflow.trainer.ppo_trainer"):
        train(assets, tmp_path, "trainer.total_training_steps=1")

    assert "this run trained 1 step(s) and saved no checkpoint (trainer.save_freq=-1;" in caplog.text
    assert "nothing to resume or to turn into a Hugging Face folder with `hyflow merge`" in caplog.text
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.timeout(120)
def test_ppo_with_a_critic_trains_the_value_model_and_reports_values(assets, tmp_path):
    # save_freq=3 > the 2 steps: the checkpoint after the last step is written all the same
    steps, trainer, _ = train(
        assets, tmp_path, "algorithm.adv_estimator=gae", "trainer.critic_warmup=1", "trainer.save_freq=3"
    )

    first, second = steps[0]["data"], steps[1]["data"]
    assert "critic/vf_loss" in first and "critic/values/mean" in first and "critic/vf_explained_var" in first
    assert "actor/pg_loss" not in first  # the first step only warms up the critic
    assert "actor/pg_loss" in second and "timing_s/update_critic" in second
    assert (tmp_path / "ckpt" / "global_step_2" / "critic").is_dir()
    assert (tmp_path / "ckpt" / "global_step_2" / "trainer_state.pt").is_file()
    assert trainer.workers.critic is not None
    assert trainer.saved_steps == [2]


@pytest.mark.timeout(120)
def test_pf_ppo_resamples_each_gae_batch_by_reward_before_the_update(assets, tmp_path, monkeypatch):
    import hyflow.trainer.ppo_ops as ppo_ops_module

    resampled, original = [], ppo_ops_module.pf_ppo_resample

    def recording_resample(batch, reweight_method, weight_pow):
        out = original(batch, reweight_method, weight_pow)
        resampled.append((len(batch), len(out), reweight_method))
        return out

    monkeypatch.setattr(ppo_ops_module, "pf_ppo_resample", recording_resample)
    steps, _, _ = train(assets, tmp_path, "algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=True")

    assert resampled == [(8, 8, "pow"), (8, 8, "pow")]  # 4 prompts x 2 samples per step, drawn with replacement
    assert "actor/pg_loss" in steps[-1]["data"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus"])
def test_critic_free_estimators_train(assets, tmp_path, estimator):
    steps, _, _ = train(assets, tmp_path, f"algorithm.adv_estimator={estimator}")

    assert all("actor/pg_loss" in s["data"] for s in steps)
    assert steps[0]["data"]["critic/advantages/max"] > steps[0]["data"]["critic/advantages/min"]


@pytest.mark.timeout(120)
def test_kl_in_the_reward_uses_the_reference_policy_and_adapts_its_coefficient(assets, tmp_path):
    overrides = ["algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.1"]
    steps, trainer, _ = train(assets, tmp_path, *overrides)

    metrics = steps[-1]["data"]
    assert "timing_s/ref" in metrics and "actor/reward_kl_penalty" in metrics
    assert steps[0]["data"]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    assert trainer.kl_ctrl.value != 0.1  # the adaptive controller moved


@pytest.mark.timeout(120)
def test_kl_as_a_loss_term_reports_the_kl_loss(assets, tmp_path):
    steps, _, _ = train(assets, tmp_path, "actor_rollout_ref.actor.use_kl_loss=True")

    assert "actor/kl_loss" in steps[-1]["data"] and "timing_s/ref" in steps[-1]["data"]
    assert "actor/reward_kl_penalty" not in steps[-1]["data"]


CALLS: dict[str, int] = {"estimator": 0, "loss": 0}


@register_adv_est("test_halved_grpo")
def halved_grpo(token_level_rewards, response_mask, index, **kwargs):
    CALLS["estimator"] += 1
    advantages, returns = compute_grpo_outcome_advantage(token_level_rewards, response_mask, index)
    return advantages / 2, returns / 2


@register_policy_loss("test_counting_vanilla")
def counting_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, **kw):
    CALLS["loss"] += 1
    return compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kw)


@pytest.mark.timeout(120)
def test_a_custom_estimator_and_policy_loss_registered_in_user_code_are_used_by_name(assets, tmp_path):
    CALLS.update(estimator=0, loss=0)
    overrides = [
        "algorithm.adv_estimator=test_halved_grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=test_counting_vanilla",
    ]
    steps, _, _ = train(assets, tmp_path, *overrides)

    assert CALLS["estimator"] == 2  # once per step
    assert CALLS["loss"] == 8  # 2 steps × 2 mini-batches × 2 micro-batches
    assert steps[0]["data"]["critic/advantages/max"] <= 0.5 + 1e-6  # halved GRPO: |A| ≤ 1/√2 / ... ≤ 0.5


@pytest.mark.timeout(120)
def test_validation_reports_per_source_metrics_logs_generations_and_dumps_rollouts(assets, tmp_path):
    overrides = [
        "trainer.val_before_train=True",
        "trainer.test_freq=2",
        "trainer.log_val_generations=2",
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
        f"trainer.validation_data_dir={tmp_path / 'val'}",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    ]
    steps, _, _ = train(assets, tmp_path, *overrides)

    assert [s["step"] for s in steps] == [0, 1, 2]  # validation before training is logged at step 0
    for logged in (steps[0]["data"], steps[2]["data"]):
        assert "val-core/arith/acc/mean@2" in logged and "val-aux/arith/reward/mean@2" in logged
    assert "timing_s/testing" in steps[2]["data"] and "val-core/arith/acc/mean@2" not in steps[1]["data"]
    generations = (tmp_path / "logs" / "tests" / "tiny" / "generations.jsonl").read_text().splitlines()
    assert len(generations) == 4  # 2 samples, at step 0 and step 2
    rows = [json.loads(line) for line in (tmp_path / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {"input", "output", "score", "ground_truth", "acc", "step"} <= set(rows[0])
    assert (tmp_path / "val" / "0.jsonl").is_file()


@pytest.mark.timeout(120)
def test_dynamic_sampling_keeps_only_groups_whose_score_varies(assets, tmp_path):
    overrides = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=seq_reward"]
    steps, _, _ = train(assets, tmp_path, *overrides)

    for step in steps:
        assert step["data"]["train/num_gen_batches"] >= 1
        assert step["data"]["critic/advantages/max"] > 0  # no all-equal groups left


@pytest.mark.timeout(120)
def test_remax_generates_a_greedy_baseline(assets, tmp_path):
    steps, _, _ = train(assets, tmp_path, "algorithm.adv_estimator=remax")

    assert "timing_s/gen_max" in steps[0]["data"] and "actor/pg_loss" in steps[0]["data"]


def test_the_trainer_fills_the_schedules_total_steps_from_the_data(assets, tmp_path):
    config = tiny_config(assets, tmp_path, "trainer.total_training_steps=null", "trainer.total_epochs=3")
    trainer = PPOTrainer(config)

    assert trainer.total_training_steps == 3 * (16 // 4)
    assert config.actor_rollout_ref.actor.optim.total_training_steps == 12


def test_the_rollout_response_mask_covers_the_generated_tokens(assets, tmp_path):
    config = tiny_config(assets, tmp_path)
    trainer = PPOTrainer(config)
    trainer.init_workers()
    try:
        batch_dict = next(iter(trainer.train_loader))
        from hyflow.trainer import stages

        batch = trainer._rollout(stages.new_prompt_batch(batch_dict), {}, seed=1)
    finally:
        trainer.close()
    assert len(batch) == 8 and len(set(batch.non_tensor_batch[F.UID])) == 4
    assert list(batch.non_tensor_batch[F.UID][:2]) == [batch.non_tensor_batch[F.UID][0]] * 2  # interleaved
    response_width = batch.batch[F.RESPONSES].shape[-1]
    torch.testing.assert_close(batch.batch[F.RESPONSE_MASK], batch.batch[F.ATTENTION_MASK][:, -response_width:])


@pytest.mark.timeout(120)
def test_multi_turn_rollouts_run_through_the_agent_loop_and_report_turns(assets, tmp_path):
    overrides = ["actor_rollout_ref.rollout.multi_turn.enable=True", "data.return_raw_chat=True"]
    kwargs = "data.apply_chat_template_kwargs.enable_thinking=false"  # the agent loops render prompts as the dataset
    steps, trainer, _ = train(assets, tmp_path, *overrides, kwargs)

    assert trainer.agent_manager.context.chat_template_kwargs == {"enable_thinking": False}
    metrics = steps[-1]["data"]
    assert metrics["num_turns/mean"] == 2  # user + assistant
    assert "agent/num_turns/mean" in metrics and "actor/pg_loss" in metrics


@pytest.mark.timeout(120)
def test_a_reward_model_adds_its_score_and_the_reward_can_run_asynchronously(assets, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rm_path = tmp_path / "rm"
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(assets["model"], num_labels=1).save_pretrained(rm_path)
    AutoTokenizer.from_pretrained(assets["model"]).save_pretrained(rm_path)
    overrides = [
        "reward_model.enable=True",
        f"reward_model.model.path={rm_path}",
        "reward_model.launch_reward_fn_async=True",
        "data.return_raw_chat=True",
    ]
    steps, trainer, _ = train(assets, tmp_path, *overrides)

    assert trainer.workers.reward_model is not None
    scores = [s["data"]["critic/score/max"] for s in steps]
    # the rule scores lie on a grid of 0.25; the reward model's score, added to them, moves them off it
    assert any(abs(4 * score - round(4 * score)) > 1e-4 for score in scores)
    assert "timing_s/reward_wait" in steps[0]["data"]


@pytest.mark.timeout(120)
def test_the_command_line_entry_trains_with_overrides_and_writes_nothing_else(assets, tmp_path):
    import subprocess
    import sys

    from tests.trainer.ppo_testkit import tiny_overrides

    args = [*tiny_overrides(assets, tmp_path), "trainer.total_training_steps=1", "trainer.save_freq=1"]
    # a fresh process: without the distributed env this process's local worker group set for itself
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run(
        [sys.executable, "-m", "hyflow.trainer.main_ppo", *args],
        capture_output=True, text=True, timeout=110, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "logs" / "tests" / "tiny" / "metrics.jsonl").is_file()
    assert (tmp_path / "ckpt" / "global_step_1" / "trainer_state.pt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "logs"]  # no Hydra outputs/<date>/<time>/


@pytest.mark.timeout(180)
def test_removing_padding_trains_the_same_as_the_padded_batch(assets, tmp_path):
    """`use_remove_padding` (packed rows) for actor and critic: the same rewards and losses as the padded run."""
    runs = {}
    for remove_padding in (False, True):
        overrides = ["algorithm.adv_estimator=gae", f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
                     f"critic.model.use_remove_padding={remove_padding}"]  # fmt: skip
        runs[remove_padding], _, _ = train(assets, tmp_path / str(remove_padding), *overrides)
    for padded, packed in zip(runs[False], runs[True]):
        for key in ("critic/score/mean", "actor/pg_loss", "critic/vf_loss", "actor/entropy", "response_length/mean"):
            assert packed["data"][key] == pytest.approx(padded["data"][key], rel=1e-3, abs=1e-5), key
