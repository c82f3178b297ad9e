"""The synthetic `countdown` task: reach a target with given numbers and + - *, each number used once.

    hyflow prepare-data countdown --output data/countdown --num-numbers 3 --max-number 9

Each problem is built backwards: draw the numbers, combine all of them in a random order with random operators,
and take the (positive) result as the target, so every problem has a solution. The prompt reads
`Using the numbers [3, 5, 7], create an equation that equals 22. Put the answer in <answer></answer>.`; the ground
truth is `{"target": 22, "numbers": [3, 5, 7]}` and `extra_info["answer"]` a reference response.
"""

from __future__ import annotations

import random
from typing import Any

from hyflow.data.preprocess.arith import evaluate, format_expression
from hyflow.data.preprocess.common import make_row, seeded_splits

DATA_SOURCE = "countdown"
INSTRUCTION = "Put the answer in <answer></answer>."
_OPERATORS = "+-*"
_MAX_ATTEMPTS = 1000


def make_problem(rng: random.Random, num_numbers: int, max_number: int) -> tuple[list[int], int, str]:
    """(numbers, target, a solution) with a positive target reachable by using every number once."""
    for _ in range(_MAX_ATTEMPTS):
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        order = rng.sample(numbers, len(numbers))
        ops = [rng.choice(_OPERATORS) for _ in range(num_numbers - 1)]
        target = evaluate(order, ops)
        if target > 0:
            return numbers, target, format_expression(order, ops)
    raise RuntimeError(f"countdown: no positive target found in {_MAX_ATTEMPTS} draws")  # unreachable with ops "+*"


def make_rows(
    num_rows: int,
    seed: int,
    split: str = "train",
    num_numbers: int = 3,
    max_number: int = 9,
    instruction: str = INSTRUCTION,
) -> list[dict[str, Any]]:
    """`num_rows` schema rows; the same arguments always give the same rows."""
    if num_numbers < 2:
        raise ValueError(f"countdown: num_numbers={num_numbers} must be >= 2.")
    if max_number < 1:
        raise ValueError(f"countdown: max_number={max_number} must be >= 1.")
    rng = random.Random(seed)
    rows = []
    for index in range(num_rows):
        numbers, target, solution = make_problem(rng, num_numbers, max_number)
        content = f"Using the numbers {numbers}, create an equation that equals {target}. {instruction}".strip()
        ground_truth = {"target": target, "numbers": numbers}
        answer = f"<answer>{solution}</answer>"
        rows.append(make_row(DATA_SOURCE, content, "arithmetic", ground_truth, split, index, answer=answer))
    return rows


def make_splits(
    train_size: int = 1000, test_size: int = 100, seed: int = 0, **difficulty: Any
) -> dict[str, list[dict[str, Any]]]:
    """Train and test rows from two different seeds (`seed` and `seed + 1`); `difficulty` goes to `make_rows`."""
    return seeded_splits(make_rows, train_size, test_size, seed, **difficulty)
