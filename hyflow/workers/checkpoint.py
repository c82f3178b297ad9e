"""Sharded, atomic checkpoints of a training role: model, optimizer, LR scheduler and RNG state.

    manager = ShardCheckpointer(model, optimizer, lr_scheduler, contents=["model", "optimizer", "extra"])
    manager.save("ckpt/global_step_10/actor", info={"kind": "policy", ...}, hf_assets=save_fn)
    manager.load("ckpt/global_step_10/actor")

Layout of a checkpoint folder (all ranks write; a shared filesystem when there are several nodes):

    dcp/                          torch.distributed.checkpoint shards of {"model", "optimizer"} (re-shardable)
    extra_state_rank{r}.pt        LR scheduler and RNG states of rank r
    huggingface/                  config + tokenizer (what `hyflow merge` needs to rebuild the model)
    hyflow_checkpoint.json        written last: marks the checkpoint complete and records what it holds

Atomicity: everything is written to `<path>.tmp`, and rank 0 renames it to `<path>` only once all ranks are
done, so `<path>` is either absent, the previous complete checkpoint, or the new complete one. Loading a folder
without `hyflow_checkpoint.json` is an error that changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hyflow.workers.fsdp import is_distributed

logger = logging.getLogger(__name__)

MARKER_FILE = "hyflow_checkpoint.json"
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
FORMAT_VERSION = 1


def _rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def _barrier() -> None:
    if is_distributed():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def read_checkpoint_info(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's `hyflow_checkpoint.json`; a clear `ValueError` if the folder is missing or incomplete."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint {path!r} does not exist; pass the folder a save wrote (e.g. .../actor).")
    marker = os.path.join(path, MARKER_FILE)
    if not os.path.isfile(marker):
        raise ValueError(
            f"checkpoint {path!r} is incomplete: it has no {MARKER_FILE}, which hyflow writes last, so the save "
            "that produced it did not finish (or it is not a hyflow checkpoint). Nothing was loaded or changed; "
            "resume from an earlier checkpoint or delete this folder."
        )
    try:
        with open(marker) as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(
            f"checkpoint {path!r}: {MARKER_FILE} is corrupt ({type(error).__name__}: {error}), so what the folder "
            "holds is unknown. Nothing was loaded; resume from an earlier checkpoint."
        ) from None


def check_contents(contents: list[str], key: str) -> list[str]:
    unknown = [c for c in contents if c not in CHECKPOINT_CONTENTS]
    if unknown:
        raise ValueError(f"{key}={contents!r}: unknown item(s) {unknown}; allowed: {list(CHECKPOINT_CONTENTS)}.")
    return list(contents)


class ShardCheckpointer:
    """Saves and loads one role's training state (model / optimizer shards, scheduler, RNG) atomically."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        save_contents: list[str] = ("model", "optimizer", "extra"),
        load_contents: list[str] = ("model", "optimizer", "extra"),
    ):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.save_contents = check_contents(list(save_contents), "checkpoint.save_contents")
        self.load_contents = check_contents(list(load_contents), "checkpoint.load_contents")

    def _sharded_state(self, contents: list[str]) -> dict[str, Any]:
        if "optimizer" in contents and self.optimizer is not None:
            model_state, optim_state = get_state_dict(self.model, self.optimizer)
            state = {"optimizer": optim_state}
            if "model" in contents:
                state["model"] = model_state
            return state
        return {"model": get_model_state_dict(self.model)} if "model" in contents else {}

    def save(
        self,
        path: str | os.PathLike,
        info: dict[str, Any] | None = None,
        hf_assets: Callable[[str], None] | None = None,
    ) -> str:
        """Write the checkpoint to `path` atomically (all ranks call). `hf_assets(folder)` runs on rank 0 to put
        the config / tokenizer (or a full HF model) into `path/huggingface`."""
        path = os.path.abspath(os.fspath(path))
        tmp = path + ".tmp"
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # leftovers of an interrupted save
            os.makedirs(tmp)
        _barrier()
        state = self._sharded_state(self.save_contents)
        if state:
            with _single_process_ok():
                dcp.save(state, checkpoint_id=os.path.join(tmp, "dcp"))
        if "extra" in self.save_contents:
            extra = {"rng": rng_state()}
            if self.lr_scheduler is not None:
                extra["lr_scheduler"] = self.lr_scheduler.state_dict()
            torch.save(extra, os.path.join(tmp, f"extra_state_rank{_rank()}.pt"))
        _barrier()
        if _rank() == 0:
            if hf_assets is not None:
                hf_assets(os.path.join(tmp, "huggingface"))
            world = dist.get_world_size() if is_distributed() else 1
            marker = {"format_version": FORMAT_VERSION, "world_size": world, "contents": self.save_contents}
            with open(os.path.join(tmp, MARKER_FILE), "w") as f:
                json.dump({**marker, **(info or {})}, f, indent=2)
            _replace_folder(tmp, path)
        _barrier()
        logger.info("saved checkpoint %s", path)
        return path

    def load(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore what `load_contents` names from `path` (all ranks call); returns the checkpoint info."""
        path = os.path.abspath(os.fspath(path))
        info = read_checkpoint_info(path)
        contents = [c for c in self.load_contents if c in info["contents"]]
        state = self._sharded_state(contents)
        if state:
            _load_shards(state, os.path.join(path, "dcp"))
            if "model" in state:
                set_model_state_dict(self.model, state["model"])
            if "optimizer" in state:
                set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        if "extra" in contents:
            self._load_extra(path)
        logger.info("loaded checkpoint %s (%s)", path, contents)
        return info

    def _load_extra(self, path: str) -> None:
        file = os.path.join(path, f"extra_state_rank{_rank()}.pt")
        if not os.path.isfile(file):
            logger.warning("%s has no extra state for rank %d (other world size?); skipping it", path, _rank())
            return
        try:
            extra = torch.load(file, weights_only=False)
        except Exception as error:
            raise ValueError(_unreadable(file, error)) from None
        set_rng_state(extra["rng"])
        if self.lr_scheduler is not None and "lr_scheduler" in extra:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])


def _unreadable(what: str, error: BaseException) -> str:
    if isinstance(error, CheckpointException) and error.failures:  # {rank: (exception, traceback)}: the first cause
        first = next(iter(error.failures.values()))
        error = first[0] if isinstance(first, tuple) else first
    detail = (str(error).strip().splitlines() or [""])[0][:200]
    cause = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
    return (
        f"checkpoint file {what} is unreadable ({cause}): it is truncated or corrupt. Resume from an earlier "
        "checkpoint (trainer.resume_mode=auto skips a damaged one when the step has a checksums.json)."
    )


def _load_shards(state: dict[str, Any], folder: str) -> None:
    """dcp.load into `state`, naming `.metadata` or the shard folder when a file is damaged."""
    metadata = os.path.join(folder, ".metadata")
    try:
        dcp.FileSystemReader(folder).read_metadata()
    except Exception as error:
        raise ValueError(_unreadable(metadata, error)) from None
    try:
        with _single_process_ok():
            dcp.load(state, checkpoint_id=folder)
    except (Exception, CheckpointException) as error:  # DCP's error derives from BaseException
        raise ValueError(_unreadable(f"{folder}/__*.distcp (a shard)", error)) from None


@contextlib.contextmanager
def _single_process_ok() -> Iterator[None]:
    """DCP warns when it runs without a process group; for one process that is exactly what we want."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to .* in a single process.*")
        yield


def _replace_folder(new: str, final: str) -> None:
    """Move `new` to `final`; an existing `final` is swapped out first and deleted only after the move."""
    old = final + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(new, final)
    shutil.rmtree(old, ignore_errors=True)
