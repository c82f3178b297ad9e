"""Interaction YAML config: built-in names, import paths, names, and clear errors at start-up."""

from __future__ import annotations

import textwrap

import pytest

from hyflow.agent.interactions.answer_check import AnswerCheckInteraction
from hyflow.agent.interactions.registry import initialize_interactions_from_config


def write(tmp_path, text: str) -> str:
    path = tmp_path / "interactions.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_interactions_load_by_name_with_their_config(tmp_path):
    path = write(
        tmp_path,
        """
        interaction:
          - name: gsm8k_check
            class_name: answer_check
            config: {data_source: openai/gsm8k}
          - class_name: hyflow.agent.interactions.answer_check.AnswerCheckInteraction
        """,
    )
    interactions = initialize_interactions_from_config(path)
    assert sorted(interactions) == ["AnswerCheckInteraction", "gsm8k_check"]
    assert isinstance(interactions["gsm8k_check"], AnswerCheckInteraction)
    assert interactions["gsm8k_check"].config.data_source == "openai/gsm8k"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("- {name: a, class_name: judge}", r"class_name='judge' is neither a built-in.*\['answer_check'\]"),
        ("- {name: a, class_name: answer_check, config: {treshold: 1}}", "unknown config key 'treshold'"),
        ("- {name: a, class_name: answer_check, kwargs: {}}", r"unknown: \['kwargs'\]"),
        ("- {name: a, class_name: answer_check}\n  - {name: a, class_name: answer_check}", "appears more than once"),
    ],
)
def test_bad_interaction_entries_fail_at_start_up(tmp_path, entry, message):
    with pytest.raises(ValueError, match=message):
        initialize_interactions_from_config(write(tmp_path, "interaction:\n  " + entry + "\n"))
