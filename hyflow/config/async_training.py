"""`async_training.*` (verl's section name for its asynchronous recipes): how generation and training overlap.

    trainer.placement=split async_training.mode=one_step_off            # batch k+1 generated while step k trains
    trainer.placement=split async_training.mode=fully_async async_training.max_staleness=2

`mode=sync` (the default) generates each batch with the latest weights and then trains on it, colocated or split.
The asynchronous modes need `trainer.placement=split` (a rollout pool beside the training pool, Ray backend), so
that generating and updating can run at the same time; the trainer is the same (`PPOTrainer.fit`), only where its
generated batches come from changes (`hyflow.trainer.async_rollout`). The how-to is docs/howto/async_rl.md.
The rules that read other sections live in `hyflow.config.async_rules`: the load-time checks
(`check_async_training`, one message per broken rule) and the derived chunk size (`chunk_prompts_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CHUNK_ROWS", "AsyncTrainingConfig"]

AsyncMode = Literal["sync", "one_step_off", "fully_async"]

# Rows each rollout engine gets per chunk when `chunk_prompts` is 0 (auto). Below a few hundred rows a decode step
# is bound by the host, not the GPU: on one H200 (0.5B shape, 64 prompts x 8 samples of 256 tokens per step),
# fully_async at staleness 1 ran at 0.56x the synchronous split run with chunks of 8 prompts (64 rows) and at 1.01x
# with chunks of 32 (256 rows) (benchmarks/README.md, "Asynchronous training").
CHUNK_ROWS = 256


@dataclass
class AsyncTrainingConfig:
    """Which batches the trainer trains on: fresh ones (sync), one step old, or any within a staleness bound."""

    # sync: generate, then train, every step; one_step_off: batch k+1 is generated with the weights of step k-1
    # while step k trains; fully_async: the rollout pool generates continuously into a buffer (split placement)
    mode: AsyncMode = "sync"
    # fully_async: the most policy versions (optimizer steps) a trained sample may lag behind the weights it
    # updates; older samples are dropped, and no generation starts that could only finish older (0: on-policy)
    max_staleness: int = 1
    # fully_async: prompts per generation request (each with its rollout.n samples): the unit the buffer schedules;
    # 0 (auto): the fewest prompts dividing data.train_batch_size that give every rollout engine 256 rows (CHUNK_ROWS)
    # (the whole batch if none does); agent loops schedule each prompt group alone (1)
    chunk_prompts: int = 0
