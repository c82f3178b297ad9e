"""What every reward manager shares: decode the responses of a `DataProto`, score them, and put each score on the
last valid response token of `token_level_scores`.

Shapes: B rows, P prompt tokens (left-padded), R response tokens (right-padded). The valid length of response i
is the number of ones in `attention_mask[i, P:]`; its score goes to `reward_tensor[i, length - 1]`.

A subclass implements `score(batch) -> list[float | dict]`. A dict result carries `score` plus extra fields, which
come back as `reward_extra_info` (one list per key, `nan` for rows whose scorer did not report that key; average
them with `np.nanmean`). Rows whose `reward_model.style` is "model" are not given to the rule scorer: they take
the reward model's `rm_scores` alone. For "rule" rows, `rm_scores`, when the batch has them, are added.

Every score is checked where it is produced: a result that is not a number is a `RewardFunctionError` naming the
function, the row and the value; a NaN or ±inf score, or one that overflows the float32 reward tensor (|score| >
3.4e38, e.g. 1e308), is one too (`on_non_finite="error"`, the default) or scores 0 and is flagged in the per-row
extra `reward_non_finite` (`on_non_finite="zero"`; only then does the manager report that column, so records stay
free of a flag that could only be 0). An extra field that no metric can hold (±inf or NaN, a string, anything not
a number; `pred`, the validation's majority-vote answer, is expected to be a string) is kept per row and named in
one warning per key and kind: the function, the row, the key and the value. Per-row failure flags
(`FAILURE_FLAGS`: the prime manager's errors, crashes and timeouts, and non-finite scores) become the metrics
`reward/<kind>_count` (`hyflow.reward.metrics`); when at least `stop_at_failed_fraction` of a batch's rows failed,
the run stops with a `RewardFunctionError` instead of training on zeros.

Rewards an agent program returned (`openai_agent`: the non-tensor field `agent_reward`) come first: a row whose
`agent_reward` is a number takes it as its score, and the scoring function is not called for it (the row needs no
`ground_truth`, and a manager's own shaping, such as dapo's overlong penalty, does not apply); `rm_scores`, when the
batch has them, are added as for rule rows. A row whose `agent_reward` is None (the function returned None), or a
batch without the field, is scored as above. The per-row extra `reward_from_agent` (1/0) says which rows took it.
A NaN or ±inf agent reward follows `on_non_finite` like a scorer's.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from hyflow import fields as F
from hyflow.config.reward import REWARD_CALL_TIMEOUT_S
from hyflow.protocol import DataProto
from hyflow.reward.scorers import default_compute_score

logger = logging.getLogger(__name__)

# failure kind -> per-row 0/1 extra that flags it
FAILURE_FLAGS = {"error": "reward_error", "crash": "reward_crash", "timeout": "reward_timeout",
                 "non_finite": "reward_non_finite"}  # fmt: skip
NON_FINITE_MODES = ("error", "zero")
FLOAT32_MAX = torch.finfo(torch.float32).max  # the largest score the reward tensor holds
STRING_EXTRAS = frozenset({"pred"})  # extras expected to be strings (validation's majority vote), never warned about


class RewardFunctionError(ValueError):
    """A reward function failed in a way that must stop the run; the message names the function and the rows."""


def describe_function(fn: Any) -> str:
    """A readable name of a scoring function for error messages."""
    return getattr(fn, "__qualname__", None) or repr(fn)


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


def unfit_score(score: float) -> str | None:
    """Why `score` cannot be a reward ("the non-finite score nan", overflowing float32), or None when it can."""
    if not math.isfinite(score):
        return f"the non-finite score {score}"
    if abs(score) > FLOAT32_MAX:
        return f"the score {score!r}, which overflows the float32 reward tensor (|score| <= {FLOAT32_MAX:.3g})"
    return None


def unusable_extra(key: str, value: Any) -> str | None:
    """Why the extra field `key: value` cannot become a metric ("non-finite", "non-numeric"), or None."""
    if isinstance(value, numbers.Real):
        return None if math.isfinite(float(value)) else "non-finite"
    return None if key in STRING_EXTRAS else "non-numeric"


def agent_rewards(data: DataProto) -> dict[int, float]:
    """{row: reward} for the rows whose `agent_reward` is set (an agent function returned a number)."""
    values = data.non_tensor_batch.get(F.AGENT_REWARD)
    if values is None:
        return {}
    return {row: float(value) for row, value in enumerate(values) if value is not None}


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


class RewardManager:
    """Base class: subclasses implement `score`; `__call__` turns a DataProto into `token_level_scores`.

    `compute_score` is the scoring function (None: the built-in scorer of each row's data source);
    `num_examine` decoded samples per data source are logged at INFO level on each call.
    """

    name: ClassVar[str] = ""
    batched: ClassVar[bool] = False  # True: compute_score takes lists (data_sources=..., solution_strs=..., ...)

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Any = None,
        reward_fn_key: str = F.DATA_SOURCE,
        on_non_finite: str = "error",
        stop_at_failed_fraction: float = 1.0,
        timeout_s: float | None = REWARD_CALL_TIMEOUT_S,
    ) -> None:
        if on_non_finite not in NON_FINITE_MODES:
            raise ValueError(f"reward_model.on_non_finite={on_non_finite!r} must be one of {list(NON_FINITE_MODES)}.")
        if not stop_at_failed_fraction > 0:
            raise ValueError(
                f"reward_model.stop_at_failed_fraction={stop_at_failed_fraction} must be > 0 (1.0: stop when every "
                "row of a batch failed; above 1: never stop)."
            )
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score if compute_score is not None else default_compute_score
        self.reward_fn_key = reward_fn_key
        self.on_non_finite, self.stop_at_failed_fraction = on_non_finite, stop_at_failed_fraction
        self.timeout_s = timeout_s
        self._warned_extras: set[tuple[str, str]] = set()  # (key, kind) of the extras already named in a warning

    @staticmethod
    def failure_settings(config: Any) -> dict[str, Any]:
        """The keyword arguments every manager takes from `reward_model.*` (for `from_config` overrides)."""
        rm = config.reward_model
        return {
            "on_non_finite": rm.on_non_finite,
            "stop_at_failed_fraction": rm.stop_at_failed_fraction,
            "timeout_s": rm.timeout_s,
        }

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any) -> RewardManager:
        """Build from the root `PPOTrainerConfig`; managers with settings of their own override this."""
        return cls(tokenizer, num_examine, compute_score, config.data.reward_fn_key, **cls.failure_settings(config))

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        """One result (a float, or a dict with `score`) per row of `batch`."""
        raise NotImplementedError(f"{type(self).__name__} must implement score()")

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """(B, R) float32 scores on each row's last valid response token, or {"reward_tensor",
        "reward_extra_info"} when `return_dict`."""
        num_rows, response_len = data.batch[F.RESPONSES].shape
        from_agent = self._checked_agent_rewards(data)
        rule_rows = [row for row in range(num_rows) if row not in from_agent and reward_style(data, row) != "model"]
        has_rm = F.RM_SCORES in data.batch
        if len(rule_rows) + len(from_agent) < num_rows and not has_rm:
            raise ValueError(
                "rows with reward_model.style='model' need a reward model score, but the batch has no 'rm_scores'; "
                "set reward_model.enable=True and reward_model.model.path, or give those rows style 'rule'."
            )
        batch = decode_batch(self.tokenizer, data, rule_rows, self.reward_fn_key)
        results = self.score(batch) if rule_rows else []
        scores, extra = self._checked_scores(batch, results)
        self._stop_if_failing(batch, extra)
        reward_tensor = torch.zeros(num_rows, response_len, dtype=torch.float32)
        lengths = response_lengths(data).tolist()
        placed = [*zip(batch.rows, scores), *from_agent.items()]
        for row, value in placed:
            if lengths[row] > 0:  # an empty response has no token to carry a reward
                reward_tensor[row, lengths[row] - 1] = value
        if has_rm:
            reward_tensor += data.batch[F.RM_SCORES].float().cpu()
        extra_info = {key: self._all_rows(values, batch.rows, num_rows) for key, values in extra.items()}
        if F.AGENT_REWARD in data.non_tensor_batch:
            extra_info["reward_from_agent"] = [float(row in from_agent) for row in range(num_rows)]
        self._examine(batch, scores)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info}
        return reward_tensor

    def _checked_agent_rewards(self, data: DataProto) -> dict[int, float]:
        """`agent_rewards(data)`, a NaN or ±inf one an error or 0 as `on_non_finite` says."""
        rewards = agent_rewards(data)
        for row, value in rewards.items():
            problem = unfit_score(value)
            if problem is None:
                continue
            where = f"row {row}: the agent function's reward (non-tensor field 'agent_reward') is {problem}"
            if self.on_non_finite == "error":
                raise RewardFunctionError(
                    f"{where}. Return a finite number (or None to have the response scored), or set "
                    "reward_model.on_non_finite=zero to score such rows 0."
                )
            logger.warning("%s: scored 0 (reward_model.on_non_finite=zero)", where)
            rewards[row] = 0.0
        return rewards

    def _where(self, batch: ScoringBatch, i: int) -> str:
        return (
            f"reward function {describe_function(self.compute_score)}, row {batch.rows[i]} "
            f"(data_source={batch.data_sources[i]!r}, response {batch.solution_strs[i][:80]!r})"
        )

    def _score_of(self, batch: ScoringBatch, i: int, result: Any) -> tuple[float, dict[str, Any]]:
        """(score, extra fields) of one result; a non-number or (on_non_finite="error") a NaN/inf is an error."""
        fields = {}
        value = result
        if isinstance(result, dict):
            if "score" not in result:
                raise RewardFunctionError(
                    f"{self._where(batch, i)} returned a dict without 'score' (keys {sorted(result)}); add 'score'."
                )
            value, fields = result["score"], {k: v for k, v in result.items() if k != "score"}
        zero_dim = getattr(value, "ndim", None) == 0 and hasattr(value, "item")  # a 0-d numpy array or tensor
        if not (isinstance(value, numbers.Real) or zero_dim):
            raise RewardFunctionError(
                f"{self._where(batch, i)} returned {value!r:.80} ({type(value).__name__}); a reward function returns "
                "a number, or a dict with a number under 'score'."
            )
        score = float(value)
        problem = unfit_score(score)
        flag = {FAILURE_FLAGS["non_finite"]: float(problem is not None)} if self.on_non_finite == "zero" else {}
        if problem is None:
            return score, {**fields, **flag}
        if self.on_non_finite == "error":
            raise RewardFunctionError(
                f"{self._where(batch, i)} returned {problem}. Fix the function, or set "
                "reward_model.on_non_finite=zero to score such responses 0 (counted in reward/non_finite_count)."
            )
        logger.warning("%s returned %s: scored 0 (reward_model.on_non_finite=zero)", self._where(batch, i), problem)
        return 0.0, {**fields, **flag}

    def _checked_scores(self, batch: ScoringBatch, results: list[Any]) -> tuple[list[float], dict[str, list]]:
        """(scores, extra info lists): each result checked; rows that lack a key get nan (flags: 0)."""
        checked = [self._score_of(batch, i, result) for i, result in enumerate(results)]
        self._warn_unusable_extras(batch, [fields for _, fields in checked])
        keys = sorted({key for _, fields in checked for key in fields})
        flags = set(FAILURE_FLAGS.values())
        extra = {key: [fields.get(key, 0.0 if key in flags else math.nan) for _, fields in checked] for key in keys}
        return [score for score, _ in checked], extra

    def _warn_unusable_extras(self, batch: ScoringBatch, fields: list[dict[str, Any]]) -> None:
        """One warning per (key, kind) of extra that no metric can hold, naming the function, row, key and value."""
        for i, row_fields in enumerate(fields):
            for key, value in row_fields.items():
                kind = unusable_extra(key, value)
                if kind is None or (key, kind) in self._warned_extras:
                    continue
                self._warned_extras.add((key, kind))
                counted = f", counted in reward/extra/{key}/non_finite_count" if kind == "non-finite" else ""
                logger.warning(
                    "%s returned the extra field %r = %.80r (%s): it is kept per row (rollout and validation dumps) "
                    "but left out of the metric reward/extra/%s/mean%s. Return a finite number under %r to see it "
                    "averaged. (Later rows with a %s %r are not named again.)",
                    self._where(batch, i), key, value, type(value).__name__, key, counted, key, kind, key,
                )  # fmt: skip

    def _stop_if_failing(self, batch: ScoringBatch, extra: dict[str, list]) -> None:
        """RewardFunctionError when at least `stop_at_failed_fraction` of the rows carry a failure flag."""
        flagged = [extra[flag] for flag in FAILURE_FLAGS.values() if flag in extra]
        failed = [i for i in range(len(batch.rows)) if any(values[i] == 1.0 for values in flagged)]
        if not failed or len(failed) < self.stop_at_failed_fraction * len(batch.rows):
            return
        counts = {kind: int(sum(extra[flag])) for kind, flag in FAILURE_FLAGS.items() if flag in extra}
        raise RewardFunctionError(
            f"reward function {describe_function(self.compute_score)} failed on {len(failed)} of {len(batch.rows)} "
            f"rows of a batch ({counts}; the first is {self._where(batch, failed[0])}); the warnings above name each "
            "row's failure. Training on these rewards would learn nothing, so the run stops: fix the function, or "
            "set reward_model.stop_at_failed_fraction above 1 to go on regardless."
        )

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
