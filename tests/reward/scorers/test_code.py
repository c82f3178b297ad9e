"""The code scorer: programs from responses run against test cases in the sandbox, scored like verl's prime_code."""

import json

import pytest

from hyflow.reward.scorers import default_compute_score, registered_data_sources
from hyflow.reward.scorers.code import compute_score, extract_program

pytestmark = pytest.mark.timeout(120)

ADD_TESTS = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -3\n"], "outputs": ["3\n", "7\n", "7\n"]})


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\nIt reads two numbers."


def test_a_correct_program_passes_every_test_and_scores_one():
    result = default_compute_score("codecontests", fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD_TESTS)
    assert result == {"score": 1.0, "acc": 1.0, "pass_rate": 1.0}


def test_a_partly_correct_program_scores_the_fraction_passed_or_zero_without_continuous():
    program = fenced("a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)")
    assert compute_score("apps", program, ADD_TESTS)["score"] == pytest.approx(2 / 3)
    assert compute_score("apps", program, ADD_TESTS, continuous=False)["score"] == 0.0


def test_a_program_past_the_time_limit_fails_its_test():
    program = fenced("while True:\n    pass")
    assert compute_score("taco", program, ADD_TESTS, time_limit=1, continuous=False)["score"] == 0.0


def test_a_program_past_the_memory_limit_fails_its_test():
    program = fenced("block = bytearray(2 * 2**30)\nprint(3)")
    assert compute_score("codeforces", program, ADD_TESTS, memory_limit_mb=256, continuous=False)["score"] == 0.0


def test_call_based_tests_call_the_named_function():
    cases = {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]]}
    assert compute_score("apps", fenced("def add(a, b):\n    return a + b"), cases)["acc"] == 1.0


def test_the_last_fenced_block_is_the_program_and_plain_text_is_taken_whole():
    assert extract_program("```\nfirst\n```\ntext\n```py\nsecond\n```") == "second\n"
    assert extract_program("print(1)") == "print(1)"


def test_verls_code_data_sources_are_registered():
    assert {"codecontests", "apps", "codeforces", "taco"} <= set(registered_data_sources())


def test_malformed_test_cases_are_a_clear_error():
    with pytest.raises(ValueError, match="'outputs' must be a list as long as 'inputs'"):
        compute_score("apps", "print(1)", {"inputs": ["1"], "outputs": []})
