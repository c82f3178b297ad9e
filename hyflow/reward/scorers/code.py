"""Code generation: run the response's program against the row's test cases in the sandbox (`hyflow.sandbox`).

Registered for verl's code data sources (`codecontests`, `apps`, `codeforces`, `taco`). `ground_truth` is verl's
`prime_code` test-case record, as a dict or its JSON text:

    {"inputs": ["1 2\\n", "3 4\\n"], "outputs": ["3\\n", "7\\n"]}                  # stdin -> stdout
    {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}            # call-based: add(*inputs[i])

The program is the last fenced code block of the response (```python ... ```, or the whole response when it has
none). Each test runs in a fresh sandbox with `time_limit` seconds and `memory_limit_mb`; stdout matches when its
whitespace-separated tokens equal the expected ones (call-based: the JSON of the return value equals the expected
value, or the expected value's only element). Scored as verl's `prime_code`: 1.0 when every test passes; otherwise,
with `continuous` (verl's default for these sources), the fraction of the first `max_continuous_tests` tests that
pass, else 0.0. The result also reports `acc` (all passed) and `pass_rate` over the tests that ran.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hyflow.reward.scorers import register_scorer
from hyflow.sandbox import PYTHON, SandboxConfig, run_in_sandbox_sync

CODE_DATA_SOURCES = ("codecontests", "apps", "codeforces", "taco")
_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)
_CALL_HARNESS = """

import json as _json, sys as _sys
_args = _json.loads(_sys.stdin.read())
print(_json.dumps({fn_name}(*_args)))
"""


def extract_program(response: str) -> str:
    """The last fenced code block of `response`, or the whole response when it has none."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def parse_test_cases(ground_truth: Any) -> dict[str, Any]:
    """The test-case record (see the module docstring); a ValueError says what is wrong with it."""
    cases = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else ground_truth
    if not isinstance(cases, dict) or not isinstance(cases.get("inputs"), list):
        raise ValueError(f"code ground_truth {ground_truth!r:.80} must be {{'inputs': [...], 'outputs': [...]}}.")
    if not isinstance(cases.get("outputs"), list) or len(cases["outputs"]) != len(cases["inputs"]):
        raise ValueError(f"code ground_truth: 'outputs' must be a list as long as 'inputs' ({len(cases['inputs'])}).")
    return cases


def _passes(program: str, test_input: Any, expected: Any, fn_name: str | None, config: SandboxConfig) -> bool:
    """Whether one test passes: the program run on the input in the sandbox, its output compared."""
    if fn_name is not None:
        program += _CALL_HARNESS.format(fn_name=fn_name)
        stdin = json.dumps(test_input if isinstance(test_input, list) else [test_input])
    else:
        stdin = test_input if isinstance(test_input, str) else "\n".join(map(str, test_input))
    result = run_in_sandbox_sync([PYTHON, "-I", "main.py"], config, {"main.py": program}, stdin.encode())
    if result.exit_code != 0:
        return False
    output = result.stdout.decode(errors="replace")
    if fn_name is None:
        return output.split() == str(expected).split()
    try:
        value = json.loads(output)
    except ValueError:
        return False
    return value == expected or (isinstance(expected, list) and len(expected) == 1 and value == expected[0])


@register_scorer(*CODE_DATA_SOURCES)
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    continuous: bool = True,
    max_continuous_tests: int = 10,
    time_limit: float = 6.0,
    memory_limit_mb: int = 1024,
    sandbox: str = "bwrap",
) -> dict[str, float]:
    """verl `prime_code`-style score of a program against test cases (see the module docstring)."""
    cases = parse_test_cases(ground_truth)
    config = SandboxConfig(sandbox=sandbox, time_limit=time_limit, memory_limit_mb=memory_limit_mb,
                           max_output_bytes=1 << 20)  # fmt: skip
    program, fn_name = extract_program(solution_str), cases.get("fn_name")
    tests = list(zip(cases["inputs"], cases["outputs"]))
    if not tests:
        raise ValueError("code ground_truth has no test cases; give at least one input/output pair.")
    limit = max_continuous_tests if continuous else 1  # without continuous, the first failure decides
    results: list[bool] = []
    for test_input, expected in tests:
        results.append(_passes(program, test_input, expected, fn_name, config))
        if not all(results) and len(results) >= limit:
            break
    all_pass = len(results) == len(tests) and all(results)
    fraction = sum(results[:max_continuous_tests]) / min(len(tests), max_continuous_tests)
    score = 1.0 if all_pass else (fraction if continuous else 0.0)
    return {"score": score, "acc": float(all_pass), "pass_rate": sum(results) / len(results)}
