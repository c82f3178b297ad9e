"""The answer_check interaction: scores with the task's scorer, ends on a correct answer, else gives feedback."""

from __future__ import annotations

import asyncio

import pytest

from hyflow.agent.interactions.answer_check import AnswerCheckInteraction, last_assistant_text


def respond(interaction, instance_id, answer):
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}]
    return asyncio.run(interaction.generate_response(instance_id, messages))


def test_a_wrong_answer_gets_feedback_and_a_right_one_ends_the_episode():
    interaction = AnswerCheckInteraction("answer_check", {"incorrect_feedback": "Try again."})
    instance = asyncio.run(interaction.start_interaction(ground_truth="72", data_source="openai/gsm8k"))
    assert respond(interaction, instance, "#### 70") == (False, "Try again.", 0.0, {"correct": False})
    assert respond(interaction, instance, "so #### 72") == (True, "Your answer is correct.", 1.0, {"correct": True})
    assert asyncio.run(interaction.calculate_score(instance)) == 1.0
    asyncio.run(interaction.finalize_interaction(instance))
    assert interaction.instances == {}


def test_the_data_source_can_come_from_the_config():
    interaction = AnswerCheckInteraction("check", {"data_source": "openai/gsm8k"})
    instance = asyncio.run(interaction.start_interaction(ground_truth="3"))
    assert respond(interaction, instance, "#### 3")[0] is True


def test_missing_ground_truth_or_data_source_is_a_clear_error():
    interaction = AnswerCheckInteraction("answer_check")
    with pytest.raises(ValueError, match=r"need 'ground_truth' and 'data_source'.*data_source=None"):
        asyncio.run(interaction.start_interaction(ground_truth="3"))


def test_last_assistant_text_finds_the_latest_model_turn():
    messages = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}, {"role": "assistant"}]
    assert last_assistant_text(messages) == ""
    assert last_assistant_text(messages[:2]) == "a" and last_assistant_text([]) == ""
