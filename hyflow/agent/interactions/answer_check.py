"""`answer_check`: a built-in interaction that checks the model's answer and gives feedback.

The last assistant message is scored with the task's registered scorer (`hyflow.reward.scorers`, chosen by the
sample's `data_source`) against its `ground_truth`. A correct answer ends the episode with the score as turn reward;
a wrong one gets `incorrect_feedback` as the next user message, so the model can try again (up to
`multi_turn.max_user_turns`).

    interaction:
      - name: answer_check
        class_name: answer_check
        config: {incorrect_feedback: "That is not right. Check your steps and answer again."}

    # per row: interaction_kwargs = {"name": "answer_check", "ground_truth": "42", "data_source": "openai/gsm8k"}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hyflow.agent.interactions.base import BaseInteraction, InteractionConfig
from hyflow.reward.scorers import default_compute_score


@dataclass
class AnswerCheckConfig(InteractionConfig):
    data_source: str | None = None  # scorer to use when a sample's interaction_kwargs name none
    correct_threshold: float = 1.0  # a score at or above it counts as correct
    correct_feedback: str = "Your answer is correct."
    incorrect_feedback: str = "Your answer is incorrect. Please check your work and try again."


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """Content of the last assistant message ('' when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


class AnswerCheckInteraction(BaseInteraction):
    """Ends the episode on a correct answer; otherwise asks the model to try again."""

    config_class = AnswerCheckConfig

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: Any = None, data_source: str | None = None, **kwargs: Any
    ) -> str:
        data_source = data_source or self.config.data_source
        if ground_truth is None or data_source is None:
            raise ValueError(
                f"interaction {self.name!r}: interaction_kwargs need 'ground_truth' and 'data_source' (or set "
                f"config.data_source); got ground_truth={ground_truth!r}, data_source={data_source!r}."
            )
        instance_id = await super().start_interaction(instance_id, **kwargs)
        self.instances[instance_id].update(ground_truth=ground_truth, data_source=data_source)
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        state = self.instances[instance_id]
        result = default_compute_score(state["data_source"], last_assistant_text(messages), state["ground_truth"])
        score = float(result["score"] if isinstance(result, dict) else result)
        state["score"] = score
        correct = score >= self.config.correct_threshold
        feedback = self.config.correct_feedback if correct else self.config.incorrect_feedback
        return correct, feedback, score, {"correct": correct}
