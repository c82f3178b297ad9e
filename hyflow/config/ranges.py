"""The allowed range of every number in `PPOTrainerConfig`, checked at load (`check_ranges`).

One table, `RANGES`: key -> `Range`. A value outside its range is one message naming the key, the value, the
range and the default (`None` means "not set" or "inherit" and is never checked here). The rules follow what each
number means: counts and sizes are positive, learning rates are positive, probabilities and ratios lie in
[0, 1] or (0, 1], `-1` is allowed where it is the documented "off / all / derived" value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hyflow.config.convert import get_by_path
from hyflow.config.ppo_trainer import PPOTrainerConfig


@dataclass(frozen=True)
class Range:
    """`low <= value <= high` (strict where `*_open`), or one of `also` (e.g. -1 for "off")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple[float, ...] = ()

    def holds(self, value: float) -> bool:
        if value in self.also:
            return True
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or (value < self.high or (not self.high_open and value == self.high))

    def words(self) -> str:
        if self.low is not None and self.high is not None:
            rule = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            rule = {(0, True): "positive (> 0)", (0, False): "0 or more"}.get(
                (self.low, self.low_open), f"{'above' if self.low_open else 'at least'} {self.low:g}"
            )
        else:
            rule = "a finite number"
        return rule + "".join(f" or {value:g}" for value in self.also)


POSITIVE = Range(low=0, low_open=True)
NON_NEGATIVE = Range(low=0)
FRACTION = Range(low=0, high=1)  # [0, 1]
SHARE = Range(low=0, high=1, low_open=True)  # (0, 1]
POSITIVE_OR_OFF = Range(low=0, low_open=True, also=(-1,))

_ACTOR, _ROLLOUT, _REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"


def _optim(section: str) -> dict[str, Range]:
    return {
        f"{section}.lr": POSITIVE,
        f"{section}.weight_decay": NON_NEGATIVE,
        f"{section}.betas[0]": Range(low=0, high=1, high_open=True),
        f"{section}.betas[1]": Range(low=0, high=1, high_open=True),
        f"{section}.lr_warmup_steps": Range(low=0, also=(-1,)),
        f"{section}.lr_warmup_steps_ratio": FRACTION,
        f"{section}.min_lr_ratio": FRACTION,
        f"{section}.num_cycles": POSITIVE,
        f"{section}.total_training_steps": POSITIVE_OR_OFF,
    }


RANGES: dict[str, Range] = {
    **{f"data.{k}": POSITIVE for k in ("train_batch_size", "val_batch_size", "max_prompt_length",
                                       "max_response_length", "filter_overlong_prompts_workers")},
    "data.dataloader_num_workers": NON_NEGATIVE,
    "data.train_max_samples": POSITIVE_OR_OFF,
    "data.val_max_samples": POSITIVE_OR_OFF,
    **{f"{_ACTOR}.{k}": POSITIVE for k in ("ppo_mini_batch_size", "ppo_micro_batch_size",
                                           "ppo_micro_batch_size_per_gpu", "ppo_epochs", "ppo_max_token_len_per_gpu",
                                           "grad_clip")},
    **{f"{_ACTOR}.{k}": NON_NEGATIVE for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "kl_loss_coef",
                                               "router_aux_loss_coef", "moe_load_balance_metrics_interval")},
    f"{_ACTOR}.clip_ratio_c": Range(low=1, low_open=True),
    **{f"{_ACTOR}.policy_loss.{k}": NON_NEGATIVE for k in ("clip_cov_ratio", "kl_cov_ratio", "ppo_kl_coef")},
    **_optim(f"{_ACTOR}.optim"),
    **{f"{_ROLLOUT}.{k}": POSITIVE for k in ("n", "val_kwargs.n", "tensor_model_parallel_size",
                                             "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu",
                                             "log_prob_max_token_len_per_gpu", "max_num_batched_tokens",
                                             "max_num_seqs", "max_model_len", "num_scheduler_steps",
                                             "prompt_length", "response_length", "agent.num_workers",
                                             "multi_turn.max_assistant_turns", "multi_turn.max_user_turns",
                                             "multi_turn.max_parallel_calls", "multi_turn.max_tool_response_length")},
    f"{_ROLLOUT}.temperature": NON_NEGATIVE,
    f"{_ROLLOUT}.val_kwargs.temperature": NON_NEGATIVE,
    f"{_ROLLOUT}.top_p": SHARE,
    f"{_ROLLOUT}.val_kwargs.top_p": SHARE,
    f"{_ROLLOUT}.top_k": Range(low=0, low_open=True, also=(-1,)),
    f"{_ROLLOUT}.val_kwargs.top_k": Range(low=0, low_open=True, also=(-1,)),
    f"{_ROLLOUT}.gpu_memory_utilization": SHARE,
    **{f"{_REF}.{k}": POSITIVE for k in ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu",
                                         "log_prob_max_token_len_per_gpu")},
    **{f"critic.{k}": POSITIVE for k in ("ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu",
                                         "forward_micro_batch_size", "forward_micro_batch_size_per_gpu",
                                         "ppo_epochs", "ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu",
                                         "grad_clip", "cliprange_value")},
    **_optim("critic.optim"),
    **{f"reward_model.{k}": POSITIVE for k in ("micro_batch_size", "micro_batch_size_per_gpu", "max_length",
                                               "forward_max_token_len_per_gpu", "num_processes", "timeout")},
    "reward_model.overlong_buffer.len": NON_NEGATIVE,
    "reward_model.overlong_buffer.penalty_factor": NON_NEGATIVE,
    "algorithm.gamma": FRACTION,
    "algorithm.lam": FRACTION,
    "algorithm.kl_ctrl.kl_coef": NON_NEGATIVE,
    "algorithm.kl_ctrl.horizon": POSITIVE,
    "algorithm.kl_ctrl.target_kl": POSITIVE,
    "algorithm.filter_groups.max_num_gen_batches": NON_NEGATIVE,
    **{f"trainer.{k}": POSITIVE for k in ("rollout_nnodes", "rollout_n_gpus_per_node")},
    "async_training.max_staleness": NON_NEGATIVE,
    "async_training.chunk_prompts": NON_NEGATIVE,
    **{f"trainer.{k}": POSITIVE for k in ("nnodes", "n_gpus_per_node", "total_epochs", "total_training_steps",
                                          "ray_init.num_cpus", "worker_call_timeout_s", "worker_init_timeout_s")},
    "trainer.save_freq": POSITIVE_OR_OFF,
    "trainer.test_freq": POSITIVE_OR_OFF,
    **{f"trainer.{k}": NON_NEGATIVE for k in ("critic_warmup", "log_val_generations", "max_actor_ckpt_to_keep",
                                              "max_critic_ckpt_to_keep")},
}  # fmt: skip


def check_ranges(config: PPOTrainerConfig) -> list[str]:
    """One message per number outside its range (`RANGES`)."""
    from hyflow.config.convert import default_dict

    defaults = default_dict()
    problems = []
    for key, allowed in RANGES.items():
        value = _value_at(config, key)
        if value is None or isinstance(value, bool) or allowed.holds(value):
            continue
        default = _value_at(defaults, key)
        shown = f" (default: {default!r})" if default is not None else ""
        rule = allowed.words()
        problems.append(f"{key}={value!r} must be {rule}. Fix: set {key} to a value {rule}{shown}.")
    return problems


def _value_at(node: object, key: str) -> object:
    """The value at a dotted key, `name[i]` indexing a list; None where the path does not lead anywhere."""
    path, _, index = key.partition("[")
    try:
        value = get_by_path(node, path) if not isinstance(node, dict) else _dict_path(node, path)
        return value[int(index.rstrip("]"))] if index else value
    except (AttributeError, IndexError, KeyError, TypeError):
        return None


def _dict_path(node: dict, path: str) -> object:
    for part in path.split("."):
        node = node[part]
    return node
