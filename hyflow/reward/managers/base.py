"""What every reward manager shares: decode the responses of a `DataProto`, score them, and put each score on the
last valid response token of `token_level_scores`.

Shapes: B rows, P prompt tokens (left-padded), R response tokens (right-padded). The valid length of response i
is the number of ones in `attention_mask[i, P:]`; its score goes to `reward_tensor[i, length - 1]`.

A subclass implements `score(batch) -> list[float | dict]`. A dict result carries `score` plus extra fields, which
come back as `reward_extra_info` (one list per key, `nan` for rows whose scorer did not report that key; average
them with `np.nanmean`). Rows whose `reward_model.style` is "model" are not given to the rule scorer: they take
the reward model's `rm_scores` alone. For "rule" rows, `rm_scores`, when the batch has them, are added.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from hyflow import fields as F
from hyflow.protocol import DataProto
from hyflow.reward.scorers import default_compute_score

logger = logging.getLogger(__name__)


@dataclass
class ScoringBatch:
    """The decoded, per-row inputs of a scoring call (only the rows that get a rule-based score)."""

    rows: list[int]  # row numbers in the DataProto
    data_sources: list[str]
    solution_strs: list[str]
    ground_truths: list[Any]
    extra_infos: list[Any]
    response_lengths: list[int]  # valid response tokens (attention_mask over the response part)


def response_lengths(data: DataProto) -> torch.Tensor:
    """(B,) number of valid response tokens of each row."""
    responses = data.batch[F.RESPONSES]
    if F.ATTENTION_MASK in data.batch:
        return data.batch[F.ATTENTION_MASK][:, -responses.shape[1] :].sum(-1)
    return data.batch[F.RESPONSE_MASK].sum(-1)


def _non_tensor(data: DataProto, key: str, row: int, default: Any = None) -> Any:
    array = data.non_tensor_batch.get(key)
    return default if array is None else array[row]


def reward_style(data: DataProto, row: int) -> str:
    """`reward_model.style` of a row ("rule" when the row does not say)."""
    info = _non_tensor(data, F.REWARD_MODEL, row) or {}
    return info.get("style") or "rule"


def decode_batch(tokenizer: Any, data: DataProto, rows: list[int], reward_fn_key: str) -> ScoringBatch:
    """Decode each listed row's valid response tokens and collect what a scorer needs."""
    lengths = response_lengths(data).tolist()
    responses = data.batch[F.RESPONSES]
    ground_truths = []
    for row in rows:
        info = _non_tensor(data, F.REWARD_MODEL, row)
        if not isinstance(info, dict) or "ground_truth" not in info:
            raise ValueError(
                f"row {row}: non_tensor_batch['reward_model'] is {info!r:.80}; a rule reward needs "
                "{'style': 'rule', 'ground_truth': ...} from the dataset."
            )
        ground_truths.append(info["ground_truth"])
    return ScoringBatch(
        rows=rows,
        data_sources=[str(_non_tensor(data, reward_fn_key, row, "")) for row in rows],
        solution_strs=[tokenizer.decode(responses[row, : lengths[row]], skip_special_tokens=True) for row in rows],
        ground_truths=ground_truths,
        extra_infos=[_non_tensor(data, F.EXTRA_INFO, row) for row in rows],
        response_lengths=[int(lengths[row]) for row in rows],
    )


def split_results(results: list[float | dict[str, Any]], num_rows: int) -> tuple[list[float], dict[str, list]]:
    """(scores, extra info lists) from scorer results; dict results give their `score` and extra fields."""
    scores, extras = [], [{} for _ in range(num_rows)]
    for i, result in enumerate(results):
        if isinstance(result, dict):
            if "score" not in result:
                raise ValueError(f"a reward function returned a dict without 'score' (keys {sorted(result)}).")
            scores.append(float(result["score"]))
            extras[i] = {k: v for k, v in result.items() if k != "score"}
        else:
            scores.append(float(result))
    keys = sorted({key for extra in extras for key in extra})
    return scores, {key: [extra.get(key, math.nan) for extra in extras] for key in keys}


class RewardManager:
    """Base class: subclasses implement `score`; `__call__` turns a DataProto into `token_level_scores`.

    `compute_score` is the scoring function (None: the built-in scorer of each row's data source);
    `num_examine` decoded samples per data source are logged at INFO level on each call.
    """

    name: ClassVar[str] = ""
    batched: ClassVar[bool] = False  # True: compute_score takes lists (data_sources=..., solution_strs=..., ...)

    def __init__(
        self, tokenizer: Any, num_examine: int = 0, compute_score: Any = None, reward_fn_key: str = F.DATA_SOURCE
    ) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score if compute_score is not None else default_compute_score
        self.reward_fn_key = reward_fn_key

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any) -> RewardManager:
        """Build from the root `PPOTrainerConfig`; managers with settings of their own override this."""
        return cls(tokenizer, num_examine, compute_score, config.data.reward_fn_key)

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        """One result (a float, or a dict with `score`) per row of `batch`."""
        raise NotImplementedError(f"{type(self).__name__} must implement score()")

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """(B, R) float32 scores on each row's last valid response token, or {"reward_tensor",
        "reward_extra_info"} when `return_dict`."""
        num_rows, response_len = data.batch[F.RESPONSES].shape
        rule_rows = [row for row in range(num_rows) if reward_style(data, row) != "model"]
        has_rm = F.RM_SCORES in data.batch
        if len(rule_rows) < num_rows and not has_rm:
            raise ValueError(
                "rows with reward_model.style='model' need a reward model score, but the batch has no 'rm_scores'; "
                "set reward_model.enable=True and reward_model.model.path, or give those rows style 'rule'."
            )
        batch = decode_batch(self.tokenizer, data, rule_rows, self.reward_fn_key)
        results = self.score(batch) if rule_rows else []
        scores, extra = split_results(results, len(rule_rows))
        reward_tensor = torch.zeros(num_rows, response_len, dtype=torch.float32)
        for row, length, value in zip(batch.rows, batch.response_lengths, scores):
            if length > 0:  # an empty response has no token to carry a reward
                reward_tensor[row, length - 1] = value
        if has_rm:
            reward_tensor += data.batch[F.RM_SCORES].float().cpu()
        extra_info = {key: self._all_rows(values, batch.rows, num_rows) for key, values in extra.items()}
        self._examine(batch, scores)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info}
        return reward_tensor

    @staticmethod
    def _all_rows(values: list, rows: list[int], num_rows: int) -> list:
        full = [math.nan] * num_rows
        for row, value in zip(rows, values):
            full[row] = value
        return full

    def _examine(self, batch: ScoringBatch, scores: list[float]) -> None:
        shown: dict[str, int] = defaultdict(int)
        for i, source in enumerate(batch.data_sources):
            if shown[source] >= self.num_examine:
                continue
            shown[source] += 1
            logger.info(
                "[%s] response: %r | ground truth: %r | score: %s",
                source,
                batch.solution_strs[i],
                batch.ground_truths[i],
                scores[i],
            )
