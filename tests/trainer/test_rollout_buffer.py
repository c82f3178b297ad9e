"""The fully asynchronous mode's buffer: batches of the oldest fresh chunks, the staleness bound enforced by
never starting what could only finish too stale and by dropping (and counting) what is too stale."""

import threading

import pytest
import torch

from hyflow.protocol import DataProto
from hyflow.trainer.rollout_buffer import Chunk, RolloutBuffer


def chunk(version: int, num_groups: int = 1, tag: int = 0) -> Chunk:
    return Chunk(DataProto.from_dict({"x": torch.full((num_groups, 1), tag)}), version, num_groups)


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)), daemon=True)
    thread.start()
    return thread, result


def test_take_returns_the_oldest_chunks_that_fill_one_batch():
    buffer = RolloutBuffer(groups_per_batch=2, max_staleness=1)
    for tag in range(3):
        buffer.put(chunk(version=0, tag=tag))

    taken = buffer.take(trainer_version=0)

    assert [int(c.batch.batch["x"][0, 0]) for c in taken] == [0, 1]
    assert buffer.num_groups == 1


def test_take_drops_and_counts_chunks_staler_than_the_bound():
    buffer = RolloutBuffer(groups_per_batch=2, max_staleness=1)
    buffer.put(chunk(version=0, num_groups=2))  # 3 - 0 > 1: dropped
    buffer.put(chunk(version=2, tag=1))
    buffer.put(chunk(version=3, tag=2))

    taken = buffer.take(trainer_version=3)

    assert [c.version for c in taken] == [2, 3]
    assert buffer.num_dropped_groups == 2


def test_take_waits_until_a_batch_is_complete():
    buffer = RolloutBuffer(groups_per_batch=2, max_staleness=0)
    buffer.put(chunk(version=0))
    thread, result = in_thread(buffer.take, 0)
    thread.join(0.2)
    assert thread.is_alive() and not result  # one group of two

    buffer.put(chunk(version=0))
    thread.join(5)

    assert len(result[0]) == 2


def test_a_group_that_could_only_train_too_stale_is_not_started_until_newer_weights_arrive():
    buffer = RolloutBuffer(groups_per_batch=2, max_staleness=1)
    assert buffer.admit(index=3)  # trained in step 2 by version 1: staleness 1 with version 0
    thread, result = in_thread(buffer.admit, 4)  # trained in step 3 by version 2: would be 2 behind version 0
    thread.join(0.2)
    assert thread.is_alive() and not result

    buffer.set_rollout_version(1)
    thread.join(5)

    assert result == [True]


def test_with_max_staleness_0_the_next_batch_starts_only_after_the_update():
    buffer = RolloutBuffer(groups_per_batch=2, max_staleness=0)
    assert buffer.admit(index=1)
    thread, result = in_thread(buffer.admit, 2)
    thread.join(0.2)
    assert thread.is_alive()

    buffer.set_rollout_version(1)
    thread.join(5)

    assert result == [True]


def test_closing_releases_a_waiting_producer_without_starting_it():
    buffer = RolloutBuffer(groups_per_batch=1, max_staleness=0)
    thread, result = in_thread(buffer.admit, 5)
    buffer.close()
    thread.join(5)

    assert result == [False]


def test_the_producers_error_is_raised_by_the_trainers_next_take():
    buffer = RolloutBuffer(groups_per_batch=1, max_staleness=0)
    buffer.fail(RuntimeError("rank 0 died"))

    with pytest.raises(RuntimeError, match="rank 0 died"):
        buffer.take(trainer_version=0)


def test_take_returns_nothing_once_the_producer_finished_without_a_full_batch():
    buffer = RolloutBuffer(groups_per_batch=2, max_staleness=0)
    buffer.put(chunk(version=0))
    buffer.finish()

    assert buffer.take(trainer_version=0) == []
