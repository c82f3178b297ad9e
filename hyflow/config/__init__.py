"""Typed configuration with verl's key names, checked when it loads.

    from hyflow.config import load_config
    config = load_config(["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=grpo"])

Each section lives in its own module; `load_config` / `check_config` check unknown keys, types, choices and
cross-field rules and raise one `ConfigError` listing every problem.
"""

from hyflow.config.actor_rollout_ref import (
    ActorConfig,
    ActorRolloutRefConfig,
    AgentConfig,
    MultiTurnConfig,
    PolicyLossConfig,
    RefConfig,
    RolloutConfig,
    SamplingConfig,
)
from hyflow.config.algorithm import AlgorithmConfig, FilterGroupsConfig, KLControlConfig, RolloutCorrectionConfig
from hyflow.config.common import (
    CheckpointConfig,
    FSDPConfig,
    MixedPrecisionConfig,
    ModelConfig,
    OptimConfig,
    WrapPolicyConfig,
)
from hyflow.config.critic import CriticConfig, CriticModelConfig
from hyflow.config.data import DataConfig
from hyflow.config.errors import ConfigError
from hyflow.config.loading import check_config, load_config
from hyflow.config.ppo_trainer import PPOTrainerConfig
from hyflow.config.reward import (
    CustomRewardFunctionConfig,
    OverlongBufferConfig,
    RewardFunctionConfig,
    RewardModelConfig,
    RewardModelModelConfig,
)
from hyflow.config.sft import SFTConfig, load_sft_config
from hyflow.config.trainer import RayInitConfig, TrainerConfig

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FSDPConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "MixedPrecisionConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PPOTrainerConfig",
    "PolicyLossConfig",
    "RayInitConfig",
    "RefConfig",
    "RewardFunctionConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "SFTConfig",
    "SamplingConfig",
    "TrainerConfig",
    "WrapPolicyConfig",
    "check_config",
    "load_config",
    "load_sft_config",
]
