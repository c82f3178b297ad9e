"""`finalize(config)`: every value derived from others, and the checks across fields, of a loaded
`PPOTrainerConfig`, before any worker starts. (Config *checks*; the trainer's *validation* is the loop that scores
held-out prompts, `hyflow.trainer.stages.Validator`.)

`finalize` fills what verl computes at start-up, in this order, in this one place: the engine and device names,
the backend, `~` in paths (`hyflow.config.files`), inherited keys, per-device micro-batch sizes. It returns every
broken rule as one message each. The rules, with the reason for each:

- ranges (`hyflow.config.ranges`): counts and learning rates positive, probabilities in (0, 1], ...
- batch sizes: `train_batch_size * rollout.n` samples per step split into whole mini-batches of
  `ppo_mini_batch_size * rollout.n` and over the data-parallel size `nnodes * n_gpus_per_node`; each device's
  share of a mini-batch splits into whole micro-batches (unless `use_dynamic_bsz`); the token budget fits one
  sample.
- the old-log-prob pass: `actor.recompute_old_log_prob=False` only when each batch gets exactly one optimizer step
  and nothing else reads `old_log_probs` (`PPOTrainerConfig.old_log_prob_pass_reasons`); otherwise the update would
  compute its PPO ratio against the wrong policy.
- algorithm: group estimators (GRPO, RLOO, ...) compare the `rollout.n` samples of a prompt, so need n > 1; `gae`
  needs a critic; the estimator and policy loss are registered names; KL as a loss and in the reward at once
  is allowed with a warning (verl does the same; it is usually a mistake).
- off-policy corrections (`algorithm.rollout_correction`): see `config/rollout_correction.py`.
- run: the backend can hold the devices (and Ray is installed for `ray`); agent loops get the raw chat; the
  files and folders the run reads exist (`hyflow.config.files`).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

from hyflow.config.algorithm import GROUP_ADV_ESTIMATORS
from hyflow.config.async_rules import check_async_training
from hyflow.config.convert import fill_inherited
from hyflow.config.distillation import check_distillation
from hyflow.config.files import check_paths, expand_user_paths
from hyflow.config.ppo_trainer import PPOTrainerConfig
from hyflow.config.ranges import check_ranges
from hyflow.config.rollout_correction import check_rollout_correction
from hyflow.config.router_replay import check_router_replay
from hyflow.config.sequence_parallel import fold_sequence_parallel

logger = logging.getLogger(__name__)

_ACTOR = "actor_rollout_ref.actor"
_ROLLOUT = "actor_rollout_ref.rollout"


def finalize(config: PPOTrainerConfig, check_files: bool = True) -> list[str]:
    """Fill the derived values of `config` in place and return the problems found (empty when it can run).
    `check_files=False` leaves out the file-system checks (for checking a launch line on another machine)."""
    _normalise(config)
    expand_user_paths(config)
    fill_inherited(config)
    problems = check_ranges(config)
    if not problems:  # the batch arithmetic below divides by these counts
        _fill_micro_batch_sizes(config, problems)
    if not problems:
        problems += _check_batch_sizes(config)
    problems += _check_algorithm(config)
    problems += check_rollout_correction(config)
    problems += check_async_training(config)
    problems += _check_run(config)
    problems += check_router_replay(config, check_files)
    problems += check_distillation(config)
    if check_files:
        problems += check_paths(config)
    _warn_on_doubtful_combinations(config)
    return problems


def data_parallel_size(config: PPOTrainerConfig) -> int:
    """Number of training processes: one per device on every node."""
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def _normalise(config: PPOTrainerConfig) -> None:
    fold_sequence_parallel(config)  # verl's Ulysses sizes, read as plain data parallelism
    rollout = config.actor_rollout_ref.rollout
    if rollout.name in ("vllm", "sglang", "trtllm"):
        logger.warning(
            "config: %s.name=%s: hyflow runs this on its own generation engine (name=hyflow); "
            "the sampling settings mean the same.",
            _ROLLOUT,
            rollout.name,
        )
        rollout.name = "hyflow"
    if config.trainer.device == "auto":
        import torch

        config.trainer.device = "cuda" if torch.cuda.is_available() else "cpu"
    if config.trainer.backend == "auto":
        one_process = data_parallel_size(config) == 1 and config.trainer.placement == "colocated"
        config.trainer.backend = "local" if one_process else "ray"


# ---------------------------------------------------------------------------------------------- batch sizes


def _to_per_gpu(problems: list[str], key: str, global_size: int | None, per_gpu: int | None, dp: int) -> int | None:
    """verl's deprecated global micro-batch size `key` as a per-device size (`key + '_per_gpu'`)."""
    if global_size is None:
        return per_gpu
    if per_gpu is not None:
        problems.append(
            f"You have set both {key}={global_size} and {key}_per_gpu={per_gpu}; they say the same thing. "
            f"Fix: keep only {key}_per_gpu (the size on each device)."
        )
        return per_gpu
    if global_size % dp:
        at_least = f"must be >= n_gpus (the data-parallel size {dp}) and" if global_size < dp else "must be"
        problems.append(
            f"{key}={global_size} {at_least} a multiple of the data-parallel size {dp} (nnodes * n_gpus_per_node): "
            f"it is split evenly over the devices. Fix: set {key}_per_gpu instead (the size on each device)."
        )
        return per_gpu
    return global_size // dp


def _fill_micro_batch_sizes(config: PPOTrainerConfig, problems: list[str]) -> None:
    """Per-device micro-batch sizes: from verl's global sizes, else a fallback (the whole per-device mini-batch
    for training, the training micro-batch for forward-only passes)."""
    dp = data_parallel_size(config)
    actor, rollout, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, config.actor_rollout_ref.ref
    critic, reward = config.critic, config.reward_model
    # (section, its key, the global-size field, fallback), in order: later fallbacks read earlier results
    plan: list[tuple[object, str, str, Callable[[], int]]] = [
        (actor, _ACTOR, "ppo_micro_batch_size", lambda: max(actor.ppo_mini_batch_size * rollout.n // dp, 1)),
        (rollout, _ROLLOUT, "log_prob_micro_batch_size", lambda: actor.ppo_micro_batch_size_per_gpu),
        (ref, "actor_rollout_ref.ref", "log_prob_micro_batch_size", lambda: rollout.log_prob_micro_batch_size_per_gpu),
        (critic, "critic", "ppo_micro_batch_size", lambda: max(critic.ppo_mini_batch_size * rollout.n // dp, 1)),
        (critic, "critic", "forward_micro_batch_size", lambda: critic.ppo_micro_batch_size_per_gpu),
        (reward, "reward_model", "micro_batch_size", lambda: rollout.log_prob_micro_batch_size_per_gpu),
    ]
    for section, section_key, name, fallback in plan:
        global_size, per_gpu = getattr(section, name), getattr(section, f"{name}_per_gpu")
        per_gpu = _to_per_gpu(problems, f"{section_key}.{name}", global_size, per_gpu, dp)
        setattr(section, f"{name}_per_gpu", per_gpu if per_gpu is not None else fallback())
        setattr(section, name, None)  # converted: the per-device field is now the one to read


def _check_batch_sizes(config: PPOTrainerConfig) -> list[str]:
    problems: list[str] = []
    dp = data_parallel_size(config)
    n = config.actor_rollout_ref.rollout.n
    train = config.data.train_batch_size
    if (train * n) % dp:
        problems.append(
            f"data.train_batch_size * {_ROLLOUT}.n = {train} * {n} = {train * n} samples per step must divide "
            f"evenly over the data-parallel size {dp} (trainer.nnodes * trainer.n_gpus_per_node). "
            f"Fix: make data.train_batch_size * rollout.n a multiple of {dp}."
        )
    actor, critic = config.actor_rollout_ref.actor, config.critic
    actor_mini = _check_mini_batch(_ACTOR, actor.ppo_mini_batch_size, train, n, dp)
    problems += actor_mini
    if not actor_mini and not actor.use_dynamic_bsz:
        problems += _check_micro_batch(_ACTOR, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, n, dp)
    if config.use_critic:
        same_mini = critic.ppo_mini_batch_size == actor.ppo_mini_batch_size  # then already checked: report once
        critic_mini = actor_mini if same_mini else _check_mini_batch("critic", critic.ppo_mini_batch_size, train, n, dp)
        problems += [] if same_mini else critic_mini
        if not critic_mini and not critic.use_dynamic_bsz:
            micro = critic.ppo_micro_batch_size_per_gpu
            problems += _check_micro_batch("critic", critic.ppo_mini_batch_size, micro, n, dp)
    return problems + _check_token_budgets(config)


def _check_token_budgets(config: PPOTrainerConfig) -> list[str]:
    """With use_dynamic_bsz, micro-batches are cut by tokens: the budget must hold one whole sample."""
    actor, critic = config.actor_rollout_ref.actor, config.critic
    sample_len = config.data.max_prompt_length + config.data.max_response_length
    problems = []
    for key, budget, dynamic in [
        (f"{_ACTOR}.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu, actor.use_dynamic_bsz),
        ("critic.ppo_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu, critic.use_dynamic_bsz),
    ]:
        if dynamic and budget < sample_len:
            problems.append(
                f"{key}={budget} is smaller than one sample (data.max_prompt_length + data.max_response_length = "
                f"{sample_len} tokens), so use_dynamic_bsz cannot fit it. Fix: set {key} to at least {sample_len}."
            )
    return problems


def _check_mini_batch(section: str, mini: int, train: int, n: int, dp: int) -> list[str]:
    """A section's mini-batch divides the step's batch and splits evenly over the devices."""
    key = f"{section}.ppo_mini_batch_size"
    if mini > train:
        return [f"{key}={mini} is larger than data.train_batch_size={train}. Fix: set {key} to at most {train}."]
    problems = []
    if train % mini:
        problems.append(
            f"data.train_batch_size * rollout.n = {train * n} must split into whole mini-batches of {key} * "
            f"rollout.n = {mini * n}, i.e. data.train_batch_size={train} must be a multiple of {key}={mini}. "
            f"Fix: pick a {key} that divides {train}."
        )
    if (mini * n) % dp:
        problems.append(
            f"{key} * rollout.n = {mini} * {n} = {mini * n} samples must split evenly over the data-parallel "
            f"size {dp} (trainer.nnodes * trainer.n_gpus_per_node). Fix: make {key} * rollout.n a multiple of {dp}."
        )
    return problems


def _check_micro_batch(section: str, mini: int, micro: int, n: int, dp: int) -> list[str]:
    """A section's per-device micro-batch divides its per-device share of a mini-batch."""
    per_device = mini * n // dp
    key, micro_key = f"{section}.ppo_mini_batch_size", f"{section}.ppo_micro_batch_size_per_gpu"
    if micro <= per_device and per_device % micro == 0:
        return []
    return [
        f"{micro_key}={micro} must divide each device's share of a mini-batch, {key} * rollout.n / "
        f"data-parallel size = {mini} * {n} / {dp} = {per_device} samples (mini-batch >= micro-batch). "
        f"Fix: set {micro_key} to a divisor of {per_device}, or use_dynamic_bsz=True."
    ]


# ---------------------------------------------------------------------------------------------- algorithm


def _check_algorithm(config: PPOTrainerConfig) -> list[str]:
    from hyflow.algorithms import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    problems: list[str] = []
    algorithm, rollout = config.algorithm, config.actor_rollout_ref.rollout
    estimator, loss_mode = algorithm.adv_estimator, config.actor_rollout_ref.actor.policy_loss.loss_mode
    if estimator not in ADV_ESTIMATOR_REGISTRY:
        problems.append(
            f"algorithm.adv_estimator={estimator!r} is not a registered advantage estimator. Allowed values: "
            f"{', '.join(ADV_ESTIMATOR_REGISTRY.names())}. Fix: pick one, or register yours with "
            f"@register_adv_est({estimator!r}) in code that runs before the config is loaded."
        )
    if loss_mode not in POLICY_LOSS_REGISTRY:
        problems.append(
            f"{_ACTOR}.policy_loss.loss_mode={loss_mode!r} is not a registered policy loss. Allowed values: "
            f"{', '.join(POLICY_LOSS_REGISTRY.names())}. Fix: pick one, or register yours with "
            f"@register_policy_loss({loss_mode!r}) in code that runs before the config is loaded."
        )
    if estimator in GROUP_ADV_ESTIMATORS and rollout.n < 2:
        problems.append(
            f"algorithm.adv_estimator={estimator!r} compares the samples of each prompt with each other, so it "
            f"needs {_ROLLOUT}.n > 1, but {_ROLLOUT}.n={rollout.n}. Fix: set {_ROLLOUT}.n to 2 or more "
            f"(e.g. 5), or use adv_estimator=gae with a critic."
        )
    if estimator == "gae" and not config.use_critic:
        problems.append(
            f"algorithm.adv_estimator='gae' needs a critic (value model), but critic.enable={config.critic.enable}. "
            f"Fix: set critic.enable=True (or leave it unset), or pick a critic-free estimator such as grpo."
        )
    if config.actor_rollout_ref.actor.recompute_old_log_prob is False and config.old_log_prob_pass_reasons():
        problems.append(
            f"{_ACTOR}.recompute_old_log_prob=False skips the old-log-prob pass, but the update is not exactly "
            f"on-policy or something reads old_log_probs before it: {'; '.join(config.old_log_prob_pass_reasons())}. "
            f"Fix: set {_ACTOR}.recompute_old_log_prob=auto (skips the pass only when that is safe) or True, or "
            f"make each batch one optimizer step (ppo_epochs=1, ppo_mini_batch_size=data.train_batch_size) with "
            f"nothing else reading old_log_probs."
        )
    if algorithm.filter_groups.enable and not algorithm.filter_groups.metric:
        problems.append(
            "algorithm.filter_groups.enable=True needs algorithm.filter_groups.metric (the per-sample value "
            "whose spread decides whether a group is kept), but it is None. Fix: set it, e.g. to 'acc' or 'score'."
        )
    return problems


def _check_run(config: PPOTrainerConfig) -> list[str]:
    problems: list[str] = []
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    dp = data_parallel_size(config)
    if trainer.backend == "local" and dp != 1:
        problems.append(
            f"trainer.backend='local' runs one process, but trainer.nnodes * trainer.n_gpus_per_node = {dp}. "
            "Fix: set trainer.nnodes=1 trainer.n_gpus_per_node=1, or trainer.backend=ray."
        )
    if trainer.backend == "ray" and importlib.util.find_spec("ray") is None:
        problems.append(
            "trainer.backend='ray' needs Ray, which is not installed. Fix: pip install 'hyflow[ray]', or set "
            "trainer.backend=local (one process: trainer.nnodes=1 trainer.n_gpus_per_node=1)."
        )
    if dp % rollout.tensor_model_parallel_size:
        problems.append(
            f"{_ROLLOUT}.tensor_model_parallel_size={rollout.tensor_model_parallel_size} must divide the number of "
            f"devices {dp} (trainer.nnodes * trainer.n_gpus_per_node). Fix: pick a divisor of {dp} (e.g. 1)."
        )
    elif trainer.nnodes > 1 and trainer.n_gpus_per_node % rollout.tensor_model_parallel_size:
        problems.append(
            f"{_ROLLOUT}.tensor_model_parallel_size={rollout.tensor_model_parallel_size} must divide "
            f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}, so that no engine spans two nodes (its all-reduces "
            "run every layer). Fix: pick a divisor of trainer.n_gpus_per_node."
        )
    if rollout.multi_turn.enable and rollout.tensor_model_parallel_size > 1:
        problems.append(
            f"{_ROLLOUT}.tensor_model_parallel_size={rollout.tensor_model_parallel_size} with "
            f"{_ROLLOUT}.multi_turn.enable=True: agent loops use the engine's per-request API, which a "
            "tensor-parallel engine does not serve (its ranks could see requests in different orders). "
            "Fix: set tensor_model_parallel_size=1 for multi-turn rollouts."
        )
    if rollout.multi_turn.enable and not config.data.return_raw_chat:
        problems.append(
            f"{_ROLLOUT}.multi_turn.enable=True: agent loops read the chat messages, so data.return_raw_chat must "
            "be True (it is False). Fix: set data.return_raw_chat=True."
        )
    if trainer.val_only and not config.data.val_files:
        problems.append(
            "trainer.val_only=True validates without training, but data.val_files is not set. "
            "Fix: set data.val_files, or trainer.val_only=False."
        )
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        problems.append(
            "trainer.resume_mode='resume_path' needs trainer.resume_from_path, but it is None. "
            "Fix: set trainer.resume_from_path to a checkpoint folder (global_step_N), or resume_mode=auto."
        )
    if config.reward_model.enable and not config.reward_model.model.path:
        problems.append(
            "reward_model.enable=True needs reward_model.model.path (a sequence-classification checkpoint), "
            "but it is None. Fix: set reward_model.model.path, or reward_model.enable=False."
        )
    return problems


def _warn_on_doubtful_combinations(config: PPOTrainerConfig) -> None:
    if config.actor_rollout_ref.actor.use_kl_loss and config.algorithm.use_kl_in_reward:
        logger.warning(
            "config: %s.use_kl_loss=True and algorithm.use_kl_in_reward=True both penalise KL to the reference "
            "policy, so it is counted twice. Usually you want one: use_kl_loss for GRPO, use_kl_in_reward for PPO.",
            _ACTOR,
        )
