"""`hyflow demo`: a smoke run with tiny step counts goes end to end; the table and curves report what happened."""

import builtins
import math
import re

import pytest
import torch

from hyflow.demos import runner as demo
from hyflow.demos import tools as demo_tools
from hyflow.demos.plot import CurvePoint, DemoTable, save_curves, summary, val_accuracy, val_reward
from tests.docs.markdown import REPO


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


def test_each_task_writes_into_its_own_folder_unless_output_names_one():
    plans = {task: demo.plan_from_args(demo._parser().parse_args(["--task", task])) for task in demo.TASK_OPTIONS}
    assert {task: plan.output for task, plan in plans.items()} == {task: f"hyflow-demo/{task}" for task in plans}
    assert demo.plan_from_args(demo._parser().parse_args(["--task", "tools", "--output", "runs/x"])).output == "runs/x"
    readme = (REPO / "README.md").read_text()  # README's training line reads the arithmetic task's model
    assert "actor_rollout_ref.model.path=hyflow-demo/arith/sft/huggingface" in readme


def test_demo_rejects_a_negative_step_count(capsys):
    assert demo.main(["--grpo-steps", "-1"]) == 2
    assert "--grpo-steps=-1 must be >= 0" in capsys.readouterr().err


def test_val_accuracy_averages_the_accuracy_of_every_data_source_and_ignores_other_metrics():
    metrics = {"val-core/a/acc/mean@1": 0.2, "val-core/b/acc/mean@1": 0.6, "val-aux/a/reward/std@1": 9.0}
    assert val_accuracy(metrics) == pytest.approx(0.4)
    assert val_accuracy({"critic/score/mean": 0.5}) is None


def test_a_reward_that_is_not_an_accuracy_is_reported_as_validation_reward_not_accuracy():
    assert val_accuracy({"val-core/a/reward/mean@1": 0.5}) is None
    assert val_reward({"val-core/a/reward/mean@1": 0.5}) == 0.5
    assert val_reward({"val-core/a/reward/mean@1": 0.5, "val-core/a/acc/mean@1": 0.5}) is None


def test_the_summary_says_what_readme_quotes_under_readme_names(capsys):
    table = DemoTable(phase="grpo")
    for step, (val, calls) in enumerate([(0.255, 0.34), (None, 0.5), (0.323, 0.84)]):
        metrics = {"critic/score/mean": 0.2, "agent/num_tool_calls/mean": calls}
        table.log(metrics | ({} if val is None else {"val-core/arith/reward/mean@4": val}), step=step)
    text = summary(table.rows, seconds=342)
    assert "validation reward: 0.255 after SFT -> 0.323 after GRPO" in text and "accuracy" not in text
    assert "calculator calls per episode: 0.34 at GRPO step 0 -> 0.84 at step 2" in text
    readme = " ".join((REPO / "README.md").read_text().split())
    assert re.search(r"the validation reward went [\d.]+ → [\d.]+ and the calculator calls per episode", readme)
    assert "val_rew" in capsys.readouterr().out


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
    assert lines[0] == "phase,step,train_loss,reward,val_accuracy,val_reward,tool_calls,seconds"
    assert lines[2].startswith("grpo,0,nan,nan,0.3")
