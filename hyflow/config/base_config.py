"""`BaseConfig`: read a config dataclass like a dict (`cfg["lr"]`, `cfg.get("lr", 1e-3)`, `dict(cfg)`).

verl's config dataclasses inherit such a base, and code written against them (custom losses reading
`config.get("clip_ratio_c", 3.0)`, user configs built on `verl.base_config.BaseConfig`) ports with this one:

    @dataclass
    class MyLossConfig(BaseConfig):
        beta: float = 0.1

    MyLossConfig()["beta"]         # 0.1
    MyLossConfig().get("gamma", 1) # 1

Unlike verl's, fields stay assignable after construction by default: hyflow's loader derives values (e.g.
`clip_ratio_low` from `clip_ratio`) after a config is built, and checks every value at load instead. A class that
names its `_mutable_fields` (verl's worker configs in `hyflow.config.verl_workers` do) freezes every other field
once its `__post_init__` calls `self._freeze()`: assigning one then raises `dataclasses.FrozenInstanceError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

__all__ = ["BaseConfig"]


class BaseConfig(Mapping):
    """A Mapping view of a dataclass's fields (and of attributes set on the instance later)."""

    _mutable_fields: ClassVar[frozenset[str] | None] = None  # None: every field stays assignable

    def _freeze(self) -> None:
        """From now on only `_mutable_fields` may be assigned (a no-op for classes that do not name them)."""
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        mutable = self._mutable_fields
        if mutable is not None and name not in mutable and self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__name__}.{name} is frozen once the config is built; only {sorted(mutable)} may "
                f"change. Fix: pass {name}=... when constructing it."
            )
        object.__setattr__(self, name, value)

    def _keys(self) -> list[str]:
        names = [f.name for f in dataclasses.fields(self)] if dataclasses.is_dataclass(self) else []
        return names + [name for name in vars(self) if name not in names and not name.startswith("_")]

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"config keys are strings; got {key!r} ({type(key).__name__}).")
        try:
            return getattr(self, key)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__} has no key {key!r}; its keys are {self._keys()}.") from None

    def get(self, key: str, default: Any = None) -> Any:
        """`self[key]`, or `default` when the config has no such key."""
        return getattr(self, key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())
