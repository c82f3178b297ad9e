"""`custom_reward_function`: load a user's scoring function from a Python file, checked at start-up.

    custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score \
    +custom_reward_function.reward_kwargs.bonus=0.5

The function is called as `fn(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)`
(the `batch` manager calls it once per batch with the plural names `data_sources=..., solution_strs=...,
ground_truths=..., extra_infos=...`). A missing file, a missing function, or a signature that cannot take those
arguments is a `ValueError` when the trainer starts, not mid-run.

The loaded function is wrapped in a `FileFunction`, which pickles as (path, name, kwargs) and re-imports the file
where it is unpickled, so it works in the `prime` manager's worker processes under any start method.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

SAMPLE_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
BATCH_ARGS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")


def _import_file(path: str) -> Any:
    """Import a Python file as a module under a name derived from its absolute path (imported once per process)."""
    module_name = "hyflow_custom_reward_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"custom_reward_function.path={path!r} is not a loadable Python file; point it at a .py file.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ValueError(
            f"custom_reward_function.path={path!r} raised {type(exc).__name__} while importing: {exc}. "
            f"Fix the file so that `python {path}` runs cleanly."
        ) from exc
    return module


def check_signature(fn: Callable, name: str, arg_names: tuple[str, ...], reward_kwargs: dict[str, Any]) -> None:
    """ValueError unless `fn` accepts the keyword arguments `arg_names` plus `reward_kwargs`."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: nothing to check
    try:
        signature.bind(**dict.fromkeys(arg_names), **reward_kwargs)
    except TypeError as exc:
        raise ValueError(
            f"custom reward function {name}{signature} cannot be called as {name}("
            f"{', '.join(arg_names + tuple(reward_kwargs))}): {exc}. Give it the parameters "
            f"({', '.join(arg_names)}) (extra_info may default to None), plus one per key of reward_kwargs "
            f"{sorted(reward_kwargs)} or a **kwargs."
        ) from exc


class FileFunction:
    """Function `name` of the file at `path`, called with `reward_kwargs` added; picklable by reference."""

    def __init__(self, path: str, name: str, reward_kwargs: dict[str, Any] | None = None) -> None:
        self.path, self.name = os.path.abspath(path), name
        self.reward_kwargs = dict(reward_kwargs or {})
        self._fn: Callable | None = None

    @property
    def fn(self) -> Callable:
        """The user's function (the file is imported on first use)."""
        if self._fn is None:
            module = _import_file(self.path)
            fn = getattr(module, self.name, None)
            if not callable(fn):
                public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
                raise ValueError(
                    f"custom_reward_function.name={self.name!r} is not a function in {self.path!r}; "
                    f"its functions are {public}. Set custom_reward_function.name to one of them."
                )
            self._fn = fn
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **self.reward_kwargs, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "reward_kwargs": self.reward_kwargs, "_fn": None}

    def __repr__(self) -> str:
        return f"FileFunction({self.path!r}, {self.name!r})"


def load_custom_function(
    path: str, name: str = "compute_score", reward_kwargs: dict[str, Any] | None = None, batched: bool = False
) -> FileFunction:
    """Load and check `name` from the file at `path`; `batched` checks the batch manager's plural signature."""
    if not os.path.isfile(path):
        raise ValueError(
            f"custom_reward_function.path={path!r} does not exist (looked in {os.path.abspath(path)!r}); "
            "give the path of a Python file that defines your scoring function."
        )
    function = FileFunction(path, name, reward_kwargs)
    check_signature(function.fn, name, BATCH_ARGS if batched else SAMPLE_ARGS, function.reward_kwargs)
    return function
