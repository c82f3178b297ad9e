"""The metrics one PPO step's batch yields, in the order the step's line lists them.

    metrics.update(compute_step_metrics(config, batch, timing, hf_config, world_size))

data statistics (`critic/*`, `response_length/*`, ...) → the reward function's extra keys (`reward_extra/*`)
→ stage timings (`timing_s/*`, `timing_per_token_ms/*`) → throughput (`perf/throughput`, ...) → the FLOPs/MFU
estimate (`perf/mfu/*`, with the device's peak only on CUDA). What belongs to the trainer's own state (step,
epoch, rollout workers' metrics, async and dynamic-sampling counters) the trainer adds before these.
"""

from __future__ import annotations

from typing import Any

import torch

from hyflow import fields as F
from hyflow.config import PPOTrainerConfig
from hyflow.protocol import DataProto
from hyflow.trainer import stages
from hyflow.trainer.flops import compute_mfu_metrics, device_peak_flops
from hyflow.trainer.metrics import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics

__all__ = ["compute_step_metrics"]


def compute_step_metrics(
    config: PPOTrainerConfig, batch: DataProto, timing: dict[str, float], hf_config: Any, world_size: int
) -> dict[str, float]:
    """The batch's data, reward-extra, timing, throughput and MFU metrics of one step on `world_size` devices."""
    metrics = dict(compute_data_metrics(batch, use_critic=config.use_critic))
    metrics.update(stages.reward_extra_metrics(batch))
    metrics.update(compute_timing_metrics(batch, timing))
    metrics.update(compute_throughput_metrics(batch, timing, n_devices=world_size))
    seq_lens = batch.batch[F.ATTENTION_MASK].sum(-1).tolist()
    peak = device_peak_flops(torch.cuda.get_device_name()) if config.trainer.device == "cuda" else None
    epochs = config.actor_rollout_ref.actor.ppo_epochs
    metrics.update(compute_mfu_metrics(hf_config, seq_lens, timing, world_size, peak, epochs))
    return metrics
