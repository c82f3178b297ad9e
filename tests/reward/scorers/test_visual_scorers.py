"""The scorers of the visual tasks: exact answers for `shapes`, verl's 0.9/0.1 split for Geometry3K."""

from hyflow.reward.scorers import default_compute_score


def test_shapes_scores_an_exact_answer_and_gives_only_format_credit_otherwise():
    assert default_compute_score("hyflow/shapes", "<answer> Red </answer>", "red")["score"] == 1.0
    wrong = default_compute_score("hyflow/shapes", "<answer>blue</answer>", "red")
    assert wrong == {"score": 0.1, "acc": 0.0, "format": 1.0}
    assert default_compute_score("hyflow/shapes", "red", "red")["score"] == 0.0


def test_geo3k_weighs_accuracy_and_the_think_then_boxed_format():
    full = default_compute_score("hiyouga/geometry3k", "<think>x = 6/2</think> so \\boxed{3}", "3")
    assert full == {"score": 1.0, "acc": 1.0, "format": 1.0}
    assert default_compute_score("hiyouga/geometry3k", "\\boxed{3.0}", "3")["score"] == 0.9
    assert default_compute_score("hiyouga/geometry3k", "<think>hm</think> \\boxed{4}", "3")["score"] == 0.1
