"""Name → function registries for advantage estimators and policy losses.

Users extend hyflow the way they extend verl:

    from hyflow.algorithms import register_adv_est, register_policy_loss

    @register_adv_est("my_est")
    def my_estimator(token_level_rewards, response_mask, **kwargs): ...

    @register_policy_loss("my_loss")
    def my_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kwargs): ...

and select them with `algorithm.adv_estimator=my_est` / `actor_rollout_ref.actor.policy_loss.loss_mode=my_loss`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from enum import Enum, StrEnum
from typing import Any

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdvantageEstimator",
    "Registry",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "register_adv_est",
    "register_policy_loss",
]


class AdvantageEstimator(StrEnum):
    """The built-in advantage estimators (the value is the name used in `algorithm.adv_estimator`)."""

    GAE = "gae"
    GRPO = "grpo"
    GRPO_VECTORIZED = "grpo_vectorized"  # verl's name for its vectorised GRPO; hyflow's `grpo` is vectorised already
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    RLOO_VECTORIZED = "rloo_vectorized"  # likewise the same estimator as `rloo`
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"


def _same_function(a: Callable, b: Callable) -> bool:
    """True for the same object, or the same function defined again by re-importing or reloading its module."""
    if a is b:
        return True
    return getattr(a, "__module__", None) == getattr(b, "__module__", object()) and getattr(
        a, "__qualname__", None
    ) == getattr(b, "__qualname__", object())


class Registry(MutableMapping[str, Callable[..., Any]]):
    """A registry of named functions that behaves like verl's registry dicts (`in`, `[name]`, `len`, `clear`, ...).

    `register` refuses a second, different function under a taken name; `lookup` is `[name]` with an error that
    lists the registered names. `kind` and `config_key` make its messages specific.
    """

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind
        self.config_key = config_key
        self._fns: dict[str, Callable[..., Any]] = {}

    def register(self, name: str | Enum) -> Callable[[Callable], Callable]:
        """Decorator: register the function under `name` (a string or an Enum member)."""
        key = self._key(name)

        def decorator(fn: Callable) -> Callable:
            existing = self._fns.get(key)
            if existing is not None and not _same_function(existing, fn):
                raise ValueError(
                    f"{self.kind} {key!r} is already registered to {existing.__module__}.{existing.__qualname__}; "
                    f"cannot register {fn.__module__}.{fn.__qualname__} under the same name. Pick another name."
                )
            self._fns[key] = fn
            return fn

        return decorator

    def lookup(self, name: str | Enum) -> Callable[..., Any]:
        """The function registered under `name`; ValueError listing the registered names otherwise."""
        key = self._key(name)
        if key not in self._fns:
            raise ValueError(
                f"{self.config_key}={key!r} is not a registered {self.kind}. Registered: {sorted(self._fns)}. "
                f"Use one of them, or register yours with the decorator before the trainer starts."
            )
        return self._fns[key]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._fns)

    # ---- the mapping protocol (verl code reads and edits its registries as dicts) ----
    def __getitem__(self, name: str | Enum) -> Callable[..., Any]:
        return self._fns[self._key(name)]

    def __setitem__(self, name: str | Enum, fn: Callable[..., Any]) -> None:
        self._fns[self._key(name)] = fn

    def __delitem__(self, name: str | Enum) -> None:
        del self._fns[self._key(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str | Enum) and self._key(name) in self._fns

    @staticmethod
    def _key(name: str | Enum) -> str:
        return name.value if isinstance(name, Enum) else str(name)


ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator", "algorithm.adv_estimator")
POLICY_LOSS_REGISTRY = Registry("policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode")


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator `fn(token_level_rewards, response_mask, ..., **kwargs)`.

    The function returns `(advantages, returns)`, both (B, T). Registering a second, different function under a
    taken name raises ValueError; registering the same function again is a no-op.
    """
    return ADV_ESTIMATOR_REGISTRY.register(name_or_enum)


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable[..., Any]:
    """The advantage estimator registered under `name_or_enum`."""
    return ADV_ESTIMATOR_REGISTRY.lookup(name_or_enum)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss.

    Signature: `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kwargs)
    -> (loss, metrics)`, where `metrics` maps names to (detached) tensors.
    """
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str) -> Callable[..., Any]:
    """The policy loss registered under `name`."""
    return POLICY_LOSS_REGISTRY.lookup(name)
