"""Split placement on the controller's side: the rollout pool's weights, and where `fit()` gets its batches.

    split = SplitRollout(config, workers, generate_batch, loader)   # trainer.placement=split
    split.start(version=step)                        # open the weight channel, give the rollout pool the weights
    batches = split.batches(first_step)              # one_step_off / fully_async; None for sync (the usual loop)
    for epoch, batch, timing, started in batches: ...train...; split.after_update(step, timing)
    split.step_metrics(batch, version)               # async/* and the staleness of the batch just trained
    split.loader_state(step)                         # the loader position a checkpoint of `step` resumes from

`fit()` stays one dataflow: only the source of its generated batches changes with `async_training.mode`.
- sync: generate with the latest weights, then train (`PPOTrainer._training_batches`); after every update the
  weights go to the rollout pool (`PoolWeightSync`, bucketed over a `WeightChannel`).
- one_step_off (`OneStepOff`): while step k trains on batch k, the rollout pool generates batch k+1 with the
  weights of step k−1 (the weights go over right before that generation starts). Staleness is 1 from step 2 on.
- fully_async (`FullyAsync`): a producer thread generates chunks of `async_training.chunk_prompts` prompts without
  pause into a `RolloutBuffer`; the trainer takes a batch when enough fresh chunks are there; the weights go over
  after every update, between two chunks (the rollout workers run one call at a time, so a chunk is sampled by
  one version). With agent loops every prompt group is a task of its own and the weights load in flight
  (hyflow/trainer/agent_groups.py). The staleness bound is the buffer's (hyflow/trainer/rollout_buffer.py).
Versions: the weights after training step k are version k (the initial or resumed weights: the step they are at).

Resume: the buffer and the generations in flight are not saved. A checkpoint of step k stores the loader position
right after the prompts of the k-th trained batch were drawn, so a resumed run regenerates every prompt that had
been drawn ahead of the trainer, with the resumed weights; only groups dropped as stale are lost (as they are
without a resume).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from hyflow import fields as F
from hyflow.config.async_rules import chunk_prompts_of
from hyflow.protocol import DataProto
from hyflow.trainer import stages
from hyflow.trainer.agent_groups import AgentGroups
from hyflow.trainer.metrics import staleness_metrics
from hyflow.trainer.rollout_buffer import Chunk, RolloutBuffer

__all__ = ["FullyAsync", "OneStepOff", "PoolWeightSync", "SplitRollout", "prompt_batches"]

logger = logging.getLogger(__name__)

# generate_batch(prompt batch, seed) -> (generated batch, worker timing, worker metrics); touches no trainer state
GenerateBatch = Callable[[DataProto, int], tuple[DataProto, dict[str, float], dict[str, float]]]
Batches = Iterator[tuple[int, DataProto, dict[str, float], float]]


def oldest_version(batch: DataProto, default: int) -> int:
    """The oldest policy version among the batch's sampled tokens (the engine's `rollout_policy_version_min`, −1
    for rows without a tracked token), `default` when no row has one."""
    versions = [int(v) for v in batch.non_tensor_batch.get(F.ROLLOUT_POLICY_VERSION_MIN, []) if int(v) >= 0]
    return min(versions, default=default)


def prompt_batches(loader: Any, total_epochs: int, first_step: int) -> Iterator[tuple[int, int, DataProto, dict]]:
    """(epoch, step the batch is for, prompt batch with uids, loader position after it), across epochs."""
    step = first_step
    while loader.epoch < total_epochs:
        epoch = loader.epoch
        for batch_dict in loader:
            step += 1
            yield epoch, step, stages.new_prompt_batch(batch_dict), loader.state_dict()


class PoolWeightSync:
    """Keeps the rollout pool at a training step's weights: training rank 0 broadcasts them bucket by bucket."""

    def __init__(self, train_group: Any, rollout_group: Any, timeout_s: float | None) -> None:
        self.train, self.rollout = train_group, rollout_group
        self.version: int | None = None  # what the rollout pool holds (None: the model folder's, unversioned)
        self.last_metrics: dict[str, float] = {}
        self._timeout_s = timeout_s or 600.0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="weight_sync")

    def _both(self, train_call: Callable[[], Any], rollout_call: Callable[[], Any]) -> Any:
        """Run one call on each pool at the same time (each blocks until the other joins the collective)."""
        sent, received = self._pool.submit(train_call), self._pool.submit(rollout_call)
        received.result()
        return sent.result()

    def open(self) -> None:
        host, port = self.train.weight_channel_address()[0]
        world = 1 + self.rollout.world_size
        self._both(
            lambda: self.train.join_weight_channel(host, port, world, self._timeout_s),
            lambda: self.rollout.join_weight_channel(host, port, world, self._timeout_s),
        )

    def sync(self, version: int) -> float:
        """Give the rollout pool the weights of `version` (nothing when it holds them); returns the seconds taken."""
        if version == self.version:
            return 0.0
        started = time.perf_counter()
        sent = self._both(self.train.send_weights, lambda: self.rollout.receive_weights(version))
        self.last_metrics = sent[0]
        self.version = version
        return time.perf_counter() - started

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class OneStepOff:
    """Batch k+1 is generated with the weights of step k−1 while step k trains (verl's one-step off-policy)."""

    def __init__(self, generate_batch: GenerateBatch, weights: PoolWeightSync, seed: int) -> None:
        self.generate_batch, self.weights, self.seed = generate_batch, weights, seed
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="one_step_off")
        self.loader_states: dict[int, dict] = {}
        self.rollout_busy_s = 0.0
        self.last_rollout_metrics: dict[str, Any] = {}

    def _generate(self, prompts: DataProto, step: int) -> tuple[DataProto, dict, dict]:
        started = time.perf_counter()
        try:
            return self.generate_batch(prompts, stages.sampling_seed(self.seed, step))
        finally:
            self.rollout_busy_s += time.perf_counter() - started

    def batches(self, prompts: Iterator[tuple[int, int, DataProto, dict]], version: Callable[[], int]) -> Batches:
        pending = None  # (epoch, future) of the batch being generated
        for epoch, step, prompt_batch, loader_state in prompts:
            self.loader_states[step] = loader_state
            if pending is not None:  # batch k is ready → sync w_{k-1}, start batch k+1, train k
                started = time.perf_counter()
                batch, timing = self._wait(pending[1])
                timing["wait_rollout"] = time.perf_counter() - started
            timing_sync = self.weights.sync(version())
            future = self._pool.submit(self._generate, prompt_batch, step)
            if pending is not None:
                timing["weight_transfer"] = timing_sync
                yield pending[0], batch, timing, started
            pending = (epoch, future)
        if pending is not None:
            started = time.perf_counter()
            batch, timing = self._wait(pending[1])
            timing["wait_rollout"] = time.perf_counter() - started
            yield pending[0], batch, timing, started

    def _wait(self, future: concurrent.futures.Future) -> tuple[DataProto, dict[str, float]]:
        batch, timing, self.last_rollout_metrics = future.result()
        return batch, dict(timing)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class FullyAsync:
    """A producer thread generates into a `RolloutBuffer`; the trainer takes batches of fresh groups. Without agent
    loops the producer generates chunk after chunk on the rollout pool; with them (`agent_manager`) every prompt
    group is a task of its own on the loops' event loop and enters the buffer when it finishes
    (hyflow.trainer.agent_groups), so a slow multi-turn sample holds back no other group."""

    def __init__(self, generate_batch: GenerateBatch, weights: PoolWeightSync, config: Any, agent_manager=None) -> None:
        self.generate_batch, self.weights = generate_batch, weights
        self.seed = config.trainer.seed
        settings = config.async_training
        self.chunk_prompts = chunk_prompts_of(config)
        groups = config.data.train_batch_size
        self.buffer = RolloutBuffer(groups_per_batch=groups, max_staleness=settings.max_staleness)
        self.groups: AgentGroups | None = None
        if agent_manager is not None:
            self.groups = AgentGroups(agent_manager, config.actor_rollout_ref.rollout, self._put, self.buffer.fail)
        self.loader_states: dict[int, dict] = {}
        self._chunk_busy_s = 0.0
        self._chunk_metrics: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def rollout_busy_s(self) -> float:
        """Seconds so far during which the rollout pool had something to generate."""
        return self.groups.busy_s if self.groups is not None else self._chunk_busy_s

    @property
    def last_rollout_metrics(self) -> dict[str, Any]:
        return self.groups.last_metrics if self.groups is not None else self._chunk_metrics

    def _put(self, batch: DataProto, index: int, epoch: int) -> None:
        """A finished chunk or group (generation index `index` of its first prompt) into the buffer."""
        for key in (F.SEED, F.GLOBAL_TOKEN_NUM):  # per chunk: set again for the whole batch
            batch.meta_info.pop(key, None)
        version = oldest_version(batch, default=self.weights.version or 0)
        num_groups = len(set(batch.non_tensor_batch[F.UID]))
        self.buffer.put(Chunk(batch, version, num_groups, epoch, index))

    def _generate_chunk(self, chunk: DataProto, seed: int, index: int, epoch: int) -> None:
        started = time.perf_counter()
        batch, _, self._chunk_metrics = self.generate_batch(chunk, seed)
        self._chunk_busy_s += time.perf_counter() - started
        self._put(batch, index, epoch)

    def _produce(self, prompts: Iterator[tuple[int, int, DataProto, dict]], first_step: int) -> None:
        groups_per_batch = self.buffer.groups_per_batch
        index = first_step * groups_per_batch  # generation index of the next group (resumed runs continue)
        try:
            for epoch, step, prompt_batch, loader_state in prompts:
                self.loader_states[step] = loader_state
                for chunk_index, begin in enumerate(range(0, len(prompt_batch), self.chunk_prompts)):
                    if not self.buffer.admit(index):  # blocks while this group could only finish too stale
                        return
                    chunk = prompt_batch[begin : begin + self.chunk_prompts]
                    seed = stages.sampling_seed(self.seed, step, chunk_index)
                    if self.groups is not None:
                        self.groups.start(chunk, seed, index, epoch)  # returns at once
                    else:
                        self._generate_chunk(chunk, seed, index, epoch)
                    index += len(chunk)
                    if self._stop.is_set():
                        return
            if self.groups is not None:
                self.groups.wait()
        except BaseException as error:  # the trainer's next take() raises it
            self.buffer.fail(error)
            return
        self.buffer.finish()

    def batches(self, prompts: Iterator[tuple[int, int, DataProto, dict]], version: Callable[[], int]) -> Batches:
        first_step = version()
        self.weights.sync(first_step)
        self.buffer.set_rollout_version(first_step)
        self._thread = threading.Thread(target=self._produce, args=(prompts, first_step), daemon=True, name="rollout")
        self._thread.start()
        while True:
            started = time.perf_counter()
            chunks = self.buffer.take(version())
            if not chunks:  # the prompts of every epoch are generated and too few are left for a batch
                return
            chunks.sort(key=lambda chunk: chunk.index)  # generation order, whatever order they finished in
            batch = DataProto.concat([chunk.batch for chunk in chunks])
            batch.meta_info[F.GLOBAL_TOKEN_NUM] = batch.batch[F.ATTENTION_MASK].sum(-1).tolist()
            yield chunks[-1].epoch, batch, {"wait_rollout": time.perf_counter() - started}, started

    def after_update(self, version: int) -> float:
        seconds = self.weights.sync(version)
        self.buffer.set_rollout_version(version)
        return seconds

    def close(self) -> None:
        self._stop.set()
        if self.groups is not None:
            self.groups.cancel()
        self.buffer.close()


class SplitRollout:
    """The controller's side of `trainer.placement=split`: weights to the rollout pool, and the batch source of
    `async_training.mode` (None for sync: the trainer's own loop generates)."""

    def __init__(
        self, config: Any, workers: Any, generate_batch: GenerateBatch, loader: Any, agent_manager: Any = None
    ) -> None:
        """`agent_manager`: the trainer's `AgentLoopManager` when the rollout runs agent loops (multi-turn); in an
        asynchronous mode its loops move to a background event loop that every thread shares."""
        self.config, self.loader = config, loader
        self.mode = config.async_training.mode
        self.weights = PoolWeightSync(workers.actor_rollout, workers.rollout, config.trainer.worker_call_timeout_s)
        self.agent_manager = agent_manager if self.mode != "sync" else None
        if self.agent_manager is not None:
            self.agent_manager.start_background_loop()
        self.source: OneStepOff | FullyAsync | None = None
        if self.mode == "one_step_off":
            self.source = OneStepOff(generate_batch, self.weights, config.trainer.seed)
        elif self.mode == "fully_async":
            self.source = FullyAsync(generate_batch, self.weights, config, self.agent_manager)
        self._last_mark = (time.perf_counter(), 0.0)  # (wall clock, rollout busy seconds) at the last step's end

    def start(self, version: int) -> None:
        """Open the weight channel and give the rollout pool the trainer's weights (initial or resumed)."""
        self.weights.open()
        self.weights.sync(version)

    def batches(self, version: Callable[[], int]) -> Batches | None:
        """The generated batches of an asynchronous mode (`version()`: the trainer's current version)."""
        if self.source is None:
            return None
        prompts = prompt_batches(self.loader, self.config.trainer.total_epochs, version())
        return self.source.batches(prompts, version)

    def after_update(self, version: int, timing: dict[str, float]) -> None:
        """After the update of step `version`: sync and fully_async send the new weights now; one_step_off sends
        them when the generation they are due for starts."""
        if isinstance(self.source, FullyAsync):
            timing["weight_transfer"] = self.source.after_update(version)
        elif self.source is None:
            timing["weight_transfer"] = self.weights.sync(version)

    def before_validation(self, version: int) -> None:
        """Validation generates on the rollout pool: with the weights of `version`, as a colocated run would."""
        if isinstance(self.source, FullyAsync):
            self.source.after_update(version)
        else:
            self.weights.sync(version)

    def step_metrics(self, batch: DataProto, trainer_version: int, timing: dict[str, float]) -> dict[str, float]:
        """`async/*`: the staleness of the batch trained with weights of `trainer_version`, the rollout pool's and
        the trainer's idle fractions since the last step, the buffer; `rollout/weight_transfer_*`."""
        from hyflow.trainer.metrics import reduce_metrics

        metrics = dict(self.weights.last_metrics)
        if F.ROLLOUT_POLICY_VERSION_MIN in batch.non_tensor_batch:
            rows = batch.non_tensor_batch[F.ROLLOUT_POLICY_VERSION_MIN]  # -1: a row without a sampled token
            versions = [int(v) if int(v) >= 0 else trainer_version for v in rows]
            metrics.update(staleness_metrics(versions, batch.batch[F.RESPONSE_MASK], trainer_version))
        now = time.perf_counter()
        busy = self.source.rollout_busy_s if self.source is not None else 0.0
        if self.source is not None:
            metrics.update(reduce_metrics(getattr(self.source, "last_rollout_metrics", {})))
            elapsed = max(now - self._last_mark[0], 1e-9)
            metrics["async/rollout_idle_frac"] = max(0.0, 1.0 - (busy - self._last_mark[1]) / elapsed)
            metrics["async/trainer_idle_frac"] = min(1.0, timing.get("wait_rollout", 0.0) / elapsed)
        if isinstance(self.source, FullyAsync):
            buffer = self.source.buffer
            metrics["async/buffer_groups"] = float(buffer.num_groups)
            metrics["async/dropped_stale_groups"] = float(buffer.num_dropped_groups)
            metrics["async/admit_wait_s"] = buffer.pop_admit_wait()
            if self.source.groups is not None:  # agent loops: groups still generating
                metrics["async/groups_in_flight"] = float(self.source.groups.num_in_flight)
        self._last_mark = (now, busy)
        return metrics

    def loader_state(self, step: int) -> dict | None:
        """The loader position a checkpoint of `step` resumes from (None: the loader's own, in sync mode)."""
        if self.source is None:
            return None
        states = self.source.loader_states
        for old in [s for s in states if s < step]:  # what no later checkpoint can need
            del states[old]
        return states.get(step)

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
        if self.agent_manager is not None:
            self.agent_manager.stop_background_loop()
        self.weights.close()
