"""`reward_model.*` and `custom_reward_function.*`: how responses are scored.

`reward_model.reward_manager` picks how scorers are called: `naive` (one call per sample), `batch` (one call per
batch), `prime` (a process pool, `num_processes` workers and a per-sample `timeout`), `dapo` (adds the
`overlong_buffer` length penalty). `reward_model.enable=True` adds a model-based reward (a sequence classifier at
`reward_model.model.path`). `custom_reward_function.path/name` loads a user's
`compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs)` from a file;
`reward_model.reward_functions` combines several scorers with weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hyflow.config.actor_rollout_ref import Strategy
from hyflow.config.common import FSDPConfig, inherit

RewardManagerName = Literal["naive", "batch", "prime", "dapo"]
NonFiniteMode = Literal["error", "zero"]
# naive/batch/dapo: the default bound of one reward function call, so a function that never returns stops the run
REWARD_CALL_TIMEOUT_S = 600.0


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong penalty: responses in the last `len` tokens before the limit lose up to
    `penalty_factor`, linearly in how far they reach into the buffer."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False


@dataclass
class RewardFunctionConfig:
    """One scorer in a weighted combination: `name` in the file at `path`, or a built-in scorer when path is None."""

    name: str = "compute_score"
    path: str | None = None
    weight: float = 1.0
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardModelModelConfig:
    """The reward model's weights and tokenizer (a Hugging Face sequence-classification checkpoint)."""

    path: str | None = None
    input_tokenizer: str | None = inherit("actor_rollout_ref.model.path")  # re-tokenize from the actor's tokenizer
    external_lib: str | None = None
    trust_remote_code: bool = False
    use_remove_padding: bool = False
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class RewardModelConfig:
    """Reward computation: the rule-based manager, and optionally a reward model on its own worker group."""

    enable: bool = False
    strategy: Strategy = "fsdp"
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size: int | None = None  # verl's deprecated global size: becomes _per_gpu at load
    micro_batch_size_per_gpu: int | None = None
    max_length: int | None = None
    use_dynamic_bsz: bool = False
    forward_max_token_len_per_gpu: int = 32768
    ulysses_sequence_parallel_size: int = 1  # verl's; read as data parallelism at load (sequence_parallel.py)
    reward_manager: RewardManagerName = "naive"
    launch_reward_fn_async: bool = False  # score the batch while old log-probs are computed
    num_processes: int = 8  # prime: worker processes
    timeout: float = 300.0  # prime: seconds per sample before it scores 0
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    reward_functions: list[RewardFunctionConfig] = field(default_factory=list)  # empty: custom or built-in scorer
    # a NaN/inf score, or one past float32's range (1e308): stop naming function, row and value; or score it 0 and
    # flag the row in the extra reward_non_finite (reported with this mode only)
    on_non_finite: NonFiniteMode = "error"
    # naive/batch/dapo: seconds one call of the reward function may take (batch: the whole batch's call); past it
    # the run stops naming the function and row. Raise it for slow scorers (None: no limit)
    timeout_s: float | None = REWARD_CALL_TIMEOUT_S
    # stop the run when at least this fraction of a batch's rows failed (error, crash, timeout, non-finite); > 1: never
    stop_at_failed_fraction: float = 1.0


@dataclass
class CustomRewardFunctionConfig:
    """A user's scoring function: `name` in the Python file at `path` (None: the built-in scorer of the data source)."""

    path: str | None = None
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
