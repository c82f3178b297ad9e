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

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from enum import Enum, StrEnum
from typing import Any

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdvantageEstimator",
    "Registry",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "lookup_in",
    "register_adv_est",
    "register_into",
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


def register_into(
    registry: MutableMapping[str, Callable], kind: str, name: str | Enum
) -> Callable[[Callable], Callable]:
    """Decorator registering a function in `registry` (any dict-like) under `name` (a string or an Enum member).

    A second, different function under a taken name raises ValueError; the same function again is a no-op.
    """
    key = _key(name)

    def decorator(fn: Callable) -> Callable:
        existing = registry.get(key)
        if existing is not None and not _same_function(existing, fn):
            raise ValueError(
                f"{kind} {key!r} is already registered to {_qualified(existing)}; cannot register "
                f"{_qualified(fn)} under the same name. Pick another name."
            )
        registry[key] = fn
        return fn

    return decorator


def lookup_in(registry: Mapping[str, Callable], kind: str, config_key: str, name: str | Enum) -> Callable:
    """`registry[name]`; a ValueError naming the config key and listing the registered names otherwise."""
    key = _key(name)
    if key not in registry:
        raise ValueError(
            f"{config_key}={key!r} is not a registered {kind}. Registered: {sorted(registry)}. "
            f"Use one of them, or register yours with the decorator before the trainer starts."
        )
    return registry[key]


def _key(name: str | Enum) -> str:
    return name.value if isinstance(name, Enum) else str(name)


def _qualified(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


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
        return register_into(self, self.kind, name)

    def lookup(self, name: str | Enum) -> Callable[..., Any]:
        """The function registered under `name`; ValueError listing the registered names otherwise."""
        return lookup_in(self, self.kind, self.config_key, name)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._fns)

    # ---- the mapping protocol (verl code reads and edits its registries as dicts) ----
    def __getitem__(self, name: str | Enum) -> Callable[..., Any]:
        return self._fns[_key(name)]

    def __setitem__(self, name: str | Enum, fn: Callable[..., Any]) -> None:
        self._fns[_key(name)] = fn

    def __delitem__(self, name: str | Enum) -> None:
        del self._fns[_key(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str | Enum) and _key(name) in self._fns


ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator", "algorithm.adv_estimator")
_LOSS_KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"
POLICY_LOSS_REGISTRY = Registry("policy loss", _LOSS_KEY)
# The functions below read these module globals when called, so code that rebinds a registry to its own dict
# (as verl's tests do: `core_algos.ADV_ESTIMATOR_REGISTRY = {...}`) registers into and looks up in that dict.


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator `fn(token_level_rewards, response_mask, ..., **kwargs)`.

    The function returns `(advantages, returns)`, both (B, T). Registering a second, different function under a
    taken name raises ValueError; registering the same function again is a no-op.
    """
    return register_into(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name_or_enum)


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable[..., Any]:
    """The advantage estimator registered under `name_or_enum`."""
    return lookup_in(ADV_ESTIMATOR_REGISTRY, "advantage estimator", "algorithm.adv_estimator", name_or_enum)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss.

    Signature: `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kwargs)
    -> (loss, metrics)`, where `metrics` maps names to (detached) tensors.
    """
    return register_into(POLICY_LOSS_REGISTRY, "policy loss", name)


def get_policy_loss_fn(name: str) -> Callable[..., Any]:
    """The policy loss registered under `name`."""
    return lookup_in(POLICY_LOSS_REGISTRY, "policy loss", _LOSS_KEY, name)
