"""How a run ends (`hyflow.trainer.shutdown`): SIGTERM becomes `TrainingStopped` in the run's process only, a second
one does not cut the clean-up short, and the reward processes end with the trainer."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from types import SimpleNamespace

import pytest

from hyflow.reward.isolated import IsolatedFunction
from hyflow.trainer.shutdown import TrainingStopped, close_reward_processes, exit_code, stop_on_sigterm
from tests.process_kit import wait_until_gone


def _deliver_sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # the handler runs at the next bytecode; the sleep is cut short by it


def test_sigterm_in_the_block_raises_training_stopped_and_the_previous_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)

    with pytest.raises(TrainingStopped) as caught, stop_on_sigterm():
        _deliver_sigterm()

    assert caught.value.signum == signal.SIGTERM and exit_code(caught.value.signum) == 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_sigterm_while_the_first_ones_clean_up_runs_does_not_cut_it_short(caplog):
    cleaned_up = False
    with pytest.raises(TrainingStopped), stop_on_sigterm():
        try:
            _deliver_sigterm()
        finally:
            _deliver_sigterm()  # e.g. a scheduler that repeats its signal
            cleaned_up = True

    assert cleaned_up
    assert "SIGTERM again: still ending the run's processes" in caplog.text


def _sleep_forever(ready) -> None:
    ready.set()
    time.sleep(600)


def test_a_child_forked_during_the_run_ends_on_sigterm_as_by_default():
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    with stop_on_sigterm():
        child = context.Process(target=_sleep_forever, args=(ready,), daemon=True)
        child.start()
        ready.wait(timeout=30)  # a signal that arrives while Python sets up the forked child is dropped by Python
        child.terminate()  # what multiprocessing's exit hook does to daemon children
        child.join(timeout=30)

    assert child.exitcode == -signal.SIGTERM  # ended by the signal, not by a TrainingStopped traceback (exit 1)


def test_closing_a_reward_manager_ends_its_forked_scoring_child():
    manager = SimpleNamespace(isolated=IsolatedFunction(os.getpid))
    child_pid = manager.isolated()

    close_reward_processes(manager)

    assert child_pid != os.getpid()
    assert wait_until_gone([child_pid], patience_s=10)
