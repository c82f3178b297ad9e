"""The root config of `python -m hyflow.trainer.main_ppo` (Hydra config name `ppo_trainer`), and the facts the
trainer derives from several sections at once (`use_critic`, `use_reference_policy`, `recompute_old_log_prob`,
`tokenizer_source`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hyflow.config.actor_rollout_ref import ActorRolloutRefConfig
from hyflow.config.algorithm import AlgorithmConfig
from hyflow.config.async_training import AsyncTrainingConfig
from hyflow.config.critic import CriticConfig
from hyflow.config.data import DataConfig
from hyflow.config.distillation import DistillationConfig
from hyflow.config.reward import CustomRewardFunctionConfig, RewardModelConfig
from hyflow.config.trainer import TrainerConfig


@dataclass
class PPOTrainerConfig:
    """Everything one PPO/GRPO run needs, section by section, with verl's key names."""

    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)  # how rollout and training overlap
    distillation: DistillationConfig = field(default_factory=DistillationConfig)  # on-policy distillation (a teacher)

    @property
    def use_critic(self) -> bool:
        """Whether a critic is trained: `critic.enable`, or when unset, exactly for the `gae` estimator."""
        if self.critic.enable is not None:
            return self.critic.enable
        return self.algorithm.adv_estimator == "gae"

    @property
    def use_reference_policy(self) -> bool:
        """Whether a reference policy is needed: for a KL loss or KL in the reward."""
        return self.actor_rollout_ref.actor.use_kl_loss or self.algorithm.use_kl_in_reward

    @property
    def tokenizer_source(self) -> tuple[str, str | None]:
        """The key and folder of the trainer's tokenizer, the first set of `data.tokenizer`,
        `actor_rollout_ref.model.tokenizer_path` and `actor_rollout_ref.model.path`; ("", None) when none is."""
        model = self.actor_rollout_ref.model
        sources = [
            ("data.tokenizer", self.data.tokenizer),
            ("actor_rollout_ref.model.tokenizer_path", model.tokenizer_path),
            ("actor_rollout_ref.model.path", model.path),
        ]
        return next(((key, path) for key, path in sources if path is not None), ("", None))

    def old_log_prob_pass_reasons(self) -> list[str]:
        """What needs `old_log_probs` from a pass of their own before the actor update, one phrase each naming its
        key; empty when the update can take them from its own forward.

        That holds when each batch gets exactly one optimizer step (`ppo_epochs == 1` and one mini-batch,
        `ppo_mini_batch_size == data.train_batch_size`, both in prompts): the weights of that step's forward are the
        weights that generated the batch and would have re-scored it, so old_log_probs == log_probs and the PPO ratio
        is 1. Nothing else may read them before the update: KL in the reward does (`apply_kl_penalty`), and so does
        a policy loss that names `old_log_probs` among its extra batch keys. Not reasons: a KL loss (it reads
        log_prob and ref_log_prob), critic warm-up steps (no actor update, so nothing reads them), and
        `rollout.calculate_log_probs` (a loss comparing rollout_log_probs with old_log_prob gets the same values;
        only the pass's `training/rollout_probs_diff_*` diagnostic is not reported). Decoupled rollout correction
        is one (its weights compare old_log_probs with rollout_log_probs); in its bypass mode nothing needs the pass:
        old_log_probs are the engine's `rollout_log_probs`.
        """
        actor, train = self.actor_rollout_ref.actor, self.data.train_batch_size
        correction = self.algorithm.rollout_correction
        if correction.bypass_mode:  # old_log_probs are the engine's (rollout correction's bypass mode)
            return []
        reasons = []
        if actor.ppo_epochs != 1:
            reasons.append(
                f"actor_rollout_ref.actor.ppo_epochs={actor.ppo_epochs} (the passes after the first one need the "
                "log-probs from before the first optimizer step)"
            )
        if actor.ppo_mini_batch_size < train:
            reasons.append(
                f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} is below "
                f"data.train_batch_size={train} (the mini-batches after the first one need the log-probs from "
                "before the first optimizer step)"
            )
        if self.algorithm.use_kl_in_reward:
            reasons.append("algorithm.use_kl_in_reward=True (the KL penalty in the reward reads old_log_probs)")
        if correction.rollout_is is not None or correction.rollout_rs is not None:
            reasons.append(
                "algorithm.rollout_correction.rollout_is / rollout_rs in decoupled mode (the IS weights and "
                "rejection compare old_log_probs with rollout_log_probs)"
            )
        if self.distillation.enabled:
            reasons.append(
                "distillation.enabled=True (the reverse KL to the teacher compares old_log_probs with the teacher's)"
            )
        if "old_log_probs" in actor.policy_loss.extra_batch_keys:
            reasons.append(
                "actor_rollout_ref.actor.policy_loss.extra_batch_keys names 'old_log_probs' (the loss reads the "
                "batch field)"
            )
        return reasons

    @property
    def recompute_old_log_prob(self) -> bool:
        """Whether the trainer runs the old-log-prob pass: `actor.recompute_old_log_prob` when it is a bool, and
        with `"auto"` exactly when something needs it (`old_log_prob_pass_reasons`). Never in rollout correction's
        bypass mode, whose old log-probs are the engine's (`algorithm.rollout_correction.bypass_mode`)."""
        if self.algorithm.rollout_correction.bypass_mode:
            return False
        setting = self.actor_rollout_ref.actor.recompute_old_log_prob
        if isinstance(setting, bool):
            return setting
        return bool(self.old_log_prob_pass_reasons())
