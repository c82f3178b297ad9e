"""`LocalWorkerGroup`: the worker-group API in the controller's own process, world size 1, no Ray.

    wg = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, config=cfg))   # or RayClassWithInitArgs
    out = wg.compute_log_prob(batch)      # a plain Python call into the worker object

Use it for one device, for tests, and for stepping through the whole pipeline with a debugger: a breakpoint in a
worker method stops there, in this process. Dispatch and collect run exactly as on Ray (with one rank), so code
that works here works on a Ray group. Calls run to completion (there is no way to interrupt a plain call), so
`timeout=` is not enforced here. A worker method that raises surfaces as `WorkerError`, chained to the original
exception (`__cause__`), whose traceback is intact for post-mortem debugging.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import traceback
from typing import Any

from hyflow.controller.errors import WorkerError
from hyflow.controller.worker import free_port
from hyflow.controller.worker_group import ClassWithInitArgs, WorkerGroup

__all__ = ["LocalWorkerGroup"]

logger = logging.getLogger(__name__)


def _set_single_process_env() -> None:
    """The distributed env of a world of one, unless the process already has one (e.g. under torchrun)."""
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if os.environ["WORLD_SIZE"] != "1":
        raise ValueError(
            f"LocalWorkerGroup runs one worker, but this process has WORLD_SIZE={os.environ['WORLD_SIZE']}. "
            "Use trainer.backend=ray for several workers, or unset WORLD_SIZE/RANK."
        )


class LocalWorkerGroup(WorkerGroup):
    """One worker object in this process, behind the same API as `RayWorkerGroup`."""

    def __init__(
        self, cls_with_init: ClassWithInitArgs | type, resource_pool: Any = None, timeout_s: float | None = None
    ) -> None:
        """`resource_pool` is accepted (and ignored) so that call sites can swap backends unchanged."""
        if not isinstance(cls_with_init, ClassWithInitArgs):
            cls_with_init = ClassWithInitArgs(cls_with_init)
        super().__init__(cls_with_init.cls, timeout_s=timeout_s)
        _set_single_process_env()
        try:
            self.worker = cls_with_init()
        except Exception as error:
            raise WorkerError(
                rank=0, method="__init__", remote_traceback=traceback.format_exc(), cause_type=type(error).__name__
            ) from error
        self._bind_worker_methods(cls_with_init.cls)

    @property
    def world_size(self) -> int:
        return 1

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        """Run the method now, in this process; the 'handle' is its result."""
        try:
            result = getattr(self.worker, method_name)(*args, **kwargs)
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
        except Exception as error:
            raise WorkerError(
                rank=rank, method=method_name, remote_traceback=traceback.format_exc(), cause_type=type(error).__name__
            ) from error
        return result

    def _wait(self, handles: list, method_name: str, timeout_s: float | None) -> list:
        return list(handles)
