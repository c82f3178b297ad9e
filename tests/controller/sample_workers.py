"""Small worker classes shared by the controller tests (importable by Ray's worker processes)."""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist
from tensordict import TensorDict

from hyflow.controller import (
    ClassWithInitArgs,
    Dispatch,
    Execute,
    Worker,
    create_colocated_worker_raw_cls,
    register,
)
from hyflow.controller.decorator import make_nd_compute_dataproto_dispatch_fn
from hyflow.protocol import DataProto


class RankWorker(Worker):
    """Answers with its rank, so tests can see which rank got which arguments."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add_rank(self, value: int) -> int:
        return value + self.rank + self.offset

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo(self, item: object, shared: object = None) -> tuple[int, object, object]:
        return self.rank, item, shared

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def describe(self, label: str) -> tuple[str, int, int]:
        return label, self.rank, os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def rank_zero_only(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        """x -> 2x per row; each output row also records the rank that computed it and the shard size."""
        x = data.batch["x"]
        rows = len(data)
        return DataProto.from_dict(
            {"doubled": x * 2, "rank": torch.full((rows,), self.rank), "shard_rows": torch.full((rows,), rows)}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_later(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def add_rank_later(self, value: int) -> int:
        return value + self.rank

    @register(dispatch_mode=Dispatch.RANK_ZERO, blocking=False)
    def rank_zero_later(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, func, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": func(data.batch["x"])})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def dist_env(self) -> dict:
        return {**self.get_dist_env(), **self.get_node_info()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_ranks(self, backend: str = "gloo") -> tuple[float, int]:
        """Sum of (rank + 1) over the group through torch.distributed, and how many GPUs this worker sees."""
        self.init_distributed(backend=backend, timeout_s=60)
        value = torch.tensor([self.rank + 1.0], device="cuda" if backend == "nccl" else "cpu")
        dist.all_reduce(value)
        return float(value.item()), torch.cuda.device_count()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} was told to fail")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on(self, rank: int) -> int:
        if self.rank == rank:
            os._exit(1)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class ActorRole(Worker):
    """One role of a colocated worker."""

    def __init__(self, step: int) -> None:
        self.step = step

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self) -> tuple[str, int]:
        return "actor", os.getpid()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def advance(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] + self.step})


class CriticRole(Worker):
    """The other role of a colocated worker."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self) -> tuple[str, int]:
        return "critic", os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def value_of(self, x: float) -> float:
        return 10.0 * x


class BrokenWorker(Worker):
    """A worker whose constructor fails, like one given a bad config."""

    def __init__(self) -> None:
        raise ValueError("actor.clip_ratio=-1: it must be positive")


class EagerDistributedWorker(Worker):
    """Joins torch.distributed in `__init__` (with the env vars the group set), as verl's workers may."""

    def __init__(self) -> None:
        dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=60))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sum_of_ranks(self) -> float:
        value = torch.tensor([float(self.rank)])
        dist.all_reduce(value)
        return float(value.item())


class MeshWorker(Worker):
    """Four ranks as a 2 (dp) × 2 (tp) mesh named "train": ranks 2d and 2d+1 share dp rank d; tp rank 0 collects."""

    def __init__(self) -> None:
        self._register_dispatch_collect_info(mesh_name="train", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"))
    def tag_rows(self, data: DataProto) -> DataProto:
        """Each row records the rank that computed it."""
        return DataProto.from_dict({"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def tag_tensordict_later(self, data: TensorDict) -> TensorDict:
        return TensorDict({"x": data["x"], "rank": torch.full((len(data),), self.rank)}, batch_size=[len(data)])


class AdderRole(Worker):
    """A role of a fused worker: adds its rank."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x: float) -> float:
        return x + self.rank


class SubtracterRole(Worker):
    """A role of a fused worker: subtracts a constant."""

    def __init__(self, amount: float) -> None:
        self.amount = amount

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def sub(self, x: float) -> float:
        return x - self.amount


class HybridWorker(
    create_colocated_worker_raw_cls({"adder": AdderRole, "subtracter": ClassWithInitArgs(SubtracterRole, 10)})
):
    """A fused worker with a method of its own that chains both roles in one process."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add_then_sub(self, x: float) -> float:
        return self.subtracter.sub(self.adder.add(x))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def roles_see_each_other(self) -> bool:
        return self.adder.fused_worker_dict["subtracter"] is self.subtracter
