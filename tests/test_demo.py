"""`hyflow demo`: a smoke run with tiny step counts goes end to end; the table and curves report what happened."""

import builtins
import math

import pytest
import torch

from hyflow import demo, demo_tools
from hyflow.demo_plot import CurvePoint, DemoTable, save_curves, val_accuracy


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # the demo sets its own thread count


def test_the_tools_task_has_its_own_sizes_and_a_flag_given_wins():
    plan = demo.plan_from_args(demo._parser().parse_args(["--task", "tools", "--grpo-steps", "3"]))
    expected = {**demo_tools.PLAN_DEFAULTS, "grpo_steps": 3}
    assert {name: getattr(plan, name) for name in expected} == expected
    assert demo.plan_from_args(demo._parser().parse_args([])) == demo.DemoPlan()  # arith: DemoPlan's defaults


# The smoke run of the whole demo is README's command, shrunk: tests/docs/test_readme.py.


def test_demo_rejects_a_negative_step_count(capsys):
    assert demo.main(["--grpo-steps", "-1"]) == 2
    assert "--grpo-steps=-1 must be >= 0" in capsys.readouterr().err


def test_val_accuracy_averages_the_accuracy_of_every_data_source_and_ignores_other_metrics():
    metrics = {"val-core/a/acc/mean@1": 0.2, "val-core/b/acc/mean@1": 0.6, "val-aux/a/reward/std@1": 9.0}
    assert val_accuracy(metrics) == pytest.approx(0.4)
    assert val_accuracy({"val-core/a/reward/mean@1": 0.5}) == 0.5
    assert val_accuracy({"critic/score/mean": 0.5}) is None


def test_table_turns_a_trainer_step_into_one_row_with_reward_and_accuracy(capsys):
    table = DemoTable(phase="grpo")
    table.log({"critic/score/mean": 0.25, "val-core/arith/acc/mean@1": 0.5, "timing_s/step": 1.5}, step=3)
    (row,) = table.rows
    assert (row.step, row.reward, row.val_accuracy, row.seconds) == (3, 0.25, 0.5, 1.5)
    assert math.isnan(row.train_loss)
    assert "0.250" in capsys.readouterr().out


def test_curves_fall_back_to_csv_without_matplotlib(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    path = save_curves([CurvePoint("sft", 1, train_loss=2.0), CurvePoint("grpo", 0, val_accuracy=0.3)], tmp_path)
    assert path.endswith("curves.csv")
    lines = (tmp_path / "curves.csv").read_text().splitlines()
    assert lines[0] == "phase,step,train_loss,reward,val_accuracy,seconds"
    assert lines[2].startswith("grpo,0,nan,nan,0.3")
