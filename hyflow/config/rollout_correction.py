"""Load-time rules of `algorithm.rollout_correction` (the off-policy corrections), one message per broken rule.

- Every correction compares with the engine's log-probs, so it needs `rollout.calculate_log_probs=True` (the
  loader does not switch it on behind your back: the key says what the batch carries).
- `rollout_is_threshold` is a number > 0 (truncated IS) or `"lower_upper"` bounds (IcePop); `rollout_rs` names
  known options and `rollout_rs_threshold` parses for them (`hyflow.algorithms.rollout_correction`'s
  `parse_is_threshold` and `parse_rejection_rules`).
- Bypass mode skips the old-log-prob pass (π_old := π_rollout), so `actor.recompute_old_log_prob=True` contradicts
  it. With `loss_type=ppo_clip` the weight π_old/π_rollout is 1 by construction and PPO's clip against π_rollout
  is the correction, so `rollout_is` / `rollout_rs` have nothing to act on; `loss_type=reinforce` puts them in the
  `reinforce_is` policy loss (set here as `actor.policy_loss.loss_mode`, replacing only the default `vanilla`).
- `loss_type` is bypass mode's choice; decoupled mode uses the configured policy loss.
"""

from __future__ import annotations

import logging

from hyflow.config.ppo_trainer import PPOTrainerConfig

logger = logging.getLogger(__name__)

_KEY = "algorithm.rollout_correction"
_LOSS_MODE = "actor_rollout_ref.actor.policy_loss.loss_mode"
REINFORCE_LOSS = "reinforce_is"


def check_rollout_correction(config: PPOTrainerConfig) -> list[str]:
    """The problems of `algorithm.rollout_correction` in `config`; selects the `reinforce_is` loss for bypass mode
    with `loss_type=reinforce`."""
    from hyflow.algorithms.rollout_correction import parse_is_threshold, parse_rejection_rules

    correction = config.algorithm.rollout_correction
    if not correction.enabled:
        if correction.loss_type != "ppo_clip":
            return [_loss_type_without_bypass(correction.loss_type)]
        return []
    problems: list[str] = []
    if not config.actor_rollout_ref.rollout.calculate_log_probs:
        problems.append(
            f"{_KEY} compares the trainer's policy with the engine's log-probs, but "
            "actor_rollout_ref.rollout.calculate_log_probs=False drops them. "
            "Fix: set actor_rollout_ref.rollout.calculate_log_probs=True."
        )
    if correction.rollout_is is not None:
        try:
            parse_is_threshold(correction.rollout_is_threshold)
        except (TypeError, ValueError) as error:
            problems.append(str(error))
    if correction.rollout_rs is not None:
        threshold = correction.rollout_rs_threshold
        try:  # the options are checked even without a threshold (1.0 is a valid bound for every option)
            parse_rejection_rules(correction.rollout_rs, 1.0 if threshold is None else threshold)
        except ValueError as error:
            problems.append(f"{error} Fix: correct {_KEY}.rollout_rs / rollout_rs_threshold.")
        else:
            if threshold is None:
                problems.append(
                    f"{_KEY}.rollout_rs={correction.rollout_rs!r} needs {_KEY}.rollout_rs_threshold, but it is None. "
                    "Fix: set it, e.g. '0.5_2.0' for a k1 option or 0.01 for k2/k3."
                )
    if correction.bypass_mode:
        problems += _check_bypass(config)
    elif correction.loss_type != "ppo_clip":
        problems.append(_loss_type_without_bypass(correction.loss_type))
    return problems


def _check_bypass(config: PPOTrainerConfig) -> list[str]:
    correction, actor = config.algorithm.rollout_correction, config.actor_rollout_ref.actor
    problems = []
    if actor.recompute_old_log_prob is True:
        problems.append(
            f"{_KEY}.bypass_mode=True skips the old-log-prob pass (old_log_probs := rollout_log_probs), but "
            "actor_rollout_ref.actor.recompute_old_log_prob=True asks for it. Fix: set recompute_old_log_prob=auto, "
            "or bypass_mode=False (decoupled mode: the pass runs and IS weights correct π_rollout → π_old)."
        )
    if correction.loss_type == "ppo_clip":
        if correction.rollout_is is not None or correction.rollout_rs is not None:
            problems.append(
                f"{_KEY}.bypass_mode=True with loss_type='ppo_clip' takes PPO's ratio against π_rollout, so the IS "
                f"weight π_old/π_rollout is 1 and nothing is rejected: rollout_is={correction.rollout_is!r}, "
                f"rollout_rs={correction.rollout_rs!r} would do nothing. Fix: set loss_type=reinforce (truncated IS "
                "and rejection of π_θ against π_rollout), bypass_mode=False, or rollout_is=null rollout_rs=null."
            )
        return problems
    loss_mode = actor.policy_loss.loss_mode
    if loss_mode not in ("vanilla", REINFORCE_LOSS):
        problems.append(
            f"{_KEY}.loss_type='reinforce' trains with the {REINFORCE_LOSS!r} policy loss, but {_LOSS_MODE}="
            f"{loss_mode!r} asks for another one. Fix: leave {_LOSS_MODE} at vanilla (or {REINFORCE_LOSS}), or use "
            "loss_type=ppo_clip."
        )
    elif loss_mode == "vanilla":
        logger.info("config: %s.loss_type=reinforce: %s=%s", _KEY, _LOSS_MODE, REINFORCE_LOSS)
        actor.policy_loss.loss_mode = REINFORCE_LOSS
    return problems


def _loss_type_without_bypass(loss_type: str) -> str:
    return (
        f"{_KEY}.loss_type={loss_type!r} is bypass mode's loss, but bypass_mode=False (decoupled mode trains with "
        f"{_LOSS_MODE}). Fix: set {_KEY}.bypass_mode=True, or loss_type=ppo_clip."
    )
