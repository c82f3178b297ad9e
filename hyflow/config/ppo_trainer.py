"""The root config of `python -m hyflow.trainer.main_ppo` (Hydra config name `ppo_trainer`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hyflow.config.actor_rollout_ref import ActorRolloutRefConfig
from hyflow.config.algorithm import AlgorithmConfig
from hyflow.config.critic import CriticConfig
from hyflow.config.data import DataConfig
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
