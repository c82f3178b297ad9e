"""`DynamicEnum`: an enum that code may extend at run time, as `register_dispatch_mode` extends `Dispatch`.

    class Color(DynamicEnum):
        _registry = {}
        _next_value = 0

    Color.register("red")         # -> Color.RED (names are upper-cased), value 0
    Color.from_name("red")        # Color.RED, or None when unknown
    Color.remove("red")           # gone again (Color.RED raises AttributeError)
    list(Color), "RED" in Color   # members in registration order; membership by name or member

Members compare by identity, so `mode is Dispatch.ONE_TO_ALL` holds. A member pickles by name: it arrives in a Ray
worker as that process's own member, registered there on arrival when only the controller had registered it (a
custom dispatch mode on a worker method), so the class must be importable there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["DynamicEnum"]


class _DynamicEnumMeta(type):
    """Iteration, membership and `Cls["NAME"]` over the members registered so far."""

    _registry: dict[str, Any]

    def __iter__(cls) -> Iterator[Any]:
        return iter(list(cls._registry.values()))

    def __contains__(cls, item: object) -> bool:
        if isinstance(item, str):
            return item.upper() in cls._registry
        return any(item is member for member in cls._registry.values())

    def __getitem__(cls, name: str) -> Any:
        return cls._registry[name.upper()]

    def names(cls) -> list[str]:
        return list(cls._registry)

    def values(cls) -> list[Any]:
        return list(cls._registry.values())


class DynamicEnum(metaclass=_DynamicEnumMeta):
    """Base class; each subclass declares its own `_registry = {}` and `_next_value = 0`."""

    _registry: dict[str, DynamicEnum] = {}
    _next_value: int = 0

    def __init__(self, name: str, value: int) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self) -> tuple:
        return _member, (type(self), self.name)

    @classmethod
    def register(cls, name: str) -> DynamicEnum:
        """Add the member `name.upper()`; a name already taken is a ValueError."""
        key = name.upper()
        if key in cls._registry:
            raise ValueError(f"{cls.__name__}.{key} is already registered; pick another name.")
        member = cls(key, cls._next_value)
        cls._registry[key] = member
        setattr(cls, key, member)
        cls._next_value += 1
        return member

    @classmethod
    def remove(cls, name: str) -> DynamicEnum:
        """Take the member `name.upper()` out again and return it."""
        key = name.upper()
        if key not in cls._registry:
            raise ValueError(f"{cls.__name__} has no member {key!r}; members: {cls.names()}.")
        delattr(cls, key)
        return cls._registry.pop(key)

    @classmethod
    def from_name(cls, name: str) -> DynamicEnum | None:
        """The member called `name` (any case), or None."""
        return cls._registry.get(name.upper())


def _member(cls: type[DynamicEnum], name: str) -> DynamicEnum:
    """Unpickling: this process's member `name`, registered here if it is not yet."""
    return cls.from_name(name) or cls.register(name)
