"""`actor_rollout_ref.*`: the hybrid-engine worker's three roles: actor (trained policy), rollout (generation)
and ref (frozen reference policy for the KL term), plus the model they share.

Keys and defaults follow verl. Micro-batch sizes are per device; `ppo_mini_batch_size` counts prompts (the trainer
multiplies it by `rollout.n`). Fields marked `inherit(...)` take another key's value when left `None`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hyflow.config.common import CheckpointConfig, FSDPConfig, ModelConfig, OptimConfig, derived, inherit

LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLLossType = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
Strategy = Literal["fsdp", "fsdp2"]  # both mean FSDP2 (`fully_shard`) in hyflow


@dataclass
class PolicyLossConfig:
    """Which policy loss (`hyflow.algorithms.get_policy_loss_fn(loss_mode)`) and the knobs of the variants."""

    loss_mode: str = "vanilla"  # vanilla, gspo, gpg, cispo, dro, clip_cov, kl_cov, or a registered name
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: float | None = None  # loss_mode=dro: weight of the squared log-ratio penalty (required there)
    # Batch fields (names from hyflow/fields.py, e.g. token_level_rewards) passed to the loss as keyword arguments.
    extra_batch_keys: list[str] = field(default_factory=list)


@dataclass
class RouterReplayConfig:
    """Routing replay of a mixture-of-experts model (verl's key; hyflow/models/router_replay.py)."""

    # disabled: the trainer's routers choose; R3: every training forward of a batch replays the experts the engine
    # chose while generating it; R2: the update replays those of the trainer's own old-log-prob pass
    mode: Literal["disabled", "R2", "R3"] = "disabled"


@dataclass
class ActorConfig:
    """PPO update of the policy: mini-batches for `ppo_epochs`, micro-batches with gradient accumulation.

    `clip_ratio_low` / `clip_ratio_high` default to `clip_ratio` (set them apart for DAPO's clip-higher).
    """

    strategy: Strategy = "fsdp"
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size: int | None = None  # verl's deprecated global size: becomes _per_gpu at load
    ppo_micro_batch_size_per_gpu: int | None = None  # None: the whole per-device mini-batch at once
    use_dynamic_bsz: bool = False  # cut micro-batches by token budget instead of by count
    ppo_max_token_len_per_gpu: int = 16384
    ppo_epochs: int = 1
    rollout_n: int | None = inherit("actor_rollout_ref.rollout.n")  # samples per prompt (verl's copy of rollout.n)
    shuffle: bool = False
    # whether to run the old-log-prob pass before the update: auto skips it when each batch gets exactly one
    # optimizer step and nothing else reads old_log_probs (the update takes them from its own forward); true always
    # runs it; false always skips it (rejected where something needs old_log_probs)
    recompute_old_log_prob: Literal["auto"] | bool = "auto"
    grad_clip: float = 1.0
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = derived()
    clip_ratio_high: float | None = derived()
    clip_ratio_c: float = 3.0  # dual-clip lower bound for negative advantages
    loss_agg_mode: LossAggMode = "token-mean"
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False  # KL to the ref policy as a loss term (GRPO) instead of in the reward
    kl_loss_coef: float = 0.001
    kl_loss_type: KLLossType = "low_var_kl"
    ulysses_sequence_parallel_size: int = 1  # verl's; read as data parallelism at load (sequence_parallel.py)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    freeze_vision_tower: bool = False  # vision-language models: no gradients into the vision encoder
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)  # MoE routing replay (R2/R3)
    # mixture-of-experts models: weight of the router's load-balancing loss in the actor loss (null: the model
    # config's router_aux_loss_coef; 0: off); reported as actor/router_aux_loss
    router_aux_loss_coef: float | None = None
    # mixture-of-experts models: report the expert load per layer (moe/layer_{i}/load_max, moe/load_imbalance)
    # every N-th actor update; 0: never (verl's actor_rollout_ref.rollout key of the same name lands here)
    moe_load_balance_metrics_interval: int = 1

    def __post_init__(self) -> None:
        if self.clip_ratio_low is None:
            self.clip_ratio_low = self.clip_ratio
        if self.clip_ratio_high is None:
            self.clip_ratio_high = self.clip_ratio


@dataclass
class SamplingConfig:
    """Sampling settings for validation (`rollout.val_kwargs`): greedy, one sample per prompt by default."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    n: int = 1
    do_sample: bool = False


@dataclass
class MultiTurnConfig:
    """Tool-calling agent rollouts (`tool_agent`): turn limits, tool-response handling, tool and user configs."""

    enable: bool = False
    format: str = "hermes"  # a registered ToolParser name
    max_assistant_turns: int | None = None  # None: until the model stops calling tools or the length runs out
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256  # characters kept of each tool response
    tool_response_truncate_side: Literal["left", "right", "middle"] = "middle"
    tool_config_path: str | None = None  # YAML listing BaseTool classes and their OpenAI function schemas
    interaction_config_path: str | None = None  # YAML listing BaseInteraction classes (simulated users)
    function_tool_path: str | None = None  # Python file of @function_tool functions, added to the YAML's tools


@dataclass
class AgentConfig:
    """The agent-loop manager: how many loop workers run samples concurrently, and extra loop registrations."""

    num_workers: int = 8
    default_agent_loop: str = "single_turn_agent"  # for rows without an `agent_name`
    agent_loop_config_path: str | None = None  # YAML registering extra agent loops by name


@dataclass
class RolloutConfig:
    """Generation: engine, sampling, lengths, memory, and log-probs of the actor's old policy.

    `name`: `hyflow` (hyflow's engine) or `hf` (`transformers.generate`); verl's `vllm` / `sglang` / `trtllm` run
    on hyflow's engine (normalised at load with a notice). `prompt_length` / `response_length` default to
    `data.max_*_length`.
    """

    name: Literal["hyflow", "hf", "vllm", "sglang", "trtllm"] = "hyflow"
    mode: Literal["sync", "async"] = "sync"  # async: agent loops over the async per-request API
    temperature: float = 1.0
    top_k: int = -1  # -1: off
    top_p: float = 1.0
    do_sample: bool = True
    n: int = 1  # samples per prompt
    ignore_eos: bool = False
    prompt_length: int | None = inherit("data.max_prompt_length")
    response_length: int | None = inherit("data.max_response_length")
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    gpu_memory_utilization: float = 0.5  # share of device memory the KV cache may take
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    max_model_len: int | None = None  # None: prompt_length + response_length
    enforce_eager: bool = False  # True: no CUDA graphs
    num_scheduler_steps: int = 8  # decode steps per host round trip (multi-step decode); 1: one per token
    async_scheduling: bool = True  # queue the next decode window before reading the current one (host overlaps device)
    free_cache_engine: bool = True  # free the KV cache while training
    partial_rollout_kv: Literal["recompute", "keep"] = "recompute"  # weights loaded mid-request: re-prefill or keep KV
    update_weights_bucket_megabytes: int = 512  # weight sync: the FSDP2 shards gathered this many MB at a time
    tensor_model_parallel_size: int = 1
    calculate_log_probs: bool = False  # return the engine's log-probs as `rollout_log_probs`
    log_prob_micro_batch_size: int | None = None  # verl's deprecated global size: becomes _per_gpu at load
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool | None = inherit("actor_rollout_ref.actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int | None = inherit("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)


@dataclass
class RefConfig:
    """The frozen reference policy (loaded from the actor's model) used for the KL loss or KL in reward."""

    strategy: Strategy | None = inherit("actor_rollout_ref.actor.strategy")  # noqa: RUF009 (a field)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    log_prob_micro_batch_size: int | None = None  # verl's deprecated global size: becomes _per_gpu at load
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool | None = inherit("actor_rollout_ref.actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int | None = inherit("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    ulysses_sequence_parallel_size: int = 1


@dataclass
class ActorRolloutRefConfig:
    """The hybrid engine: actor, rollout and ref share one process per device and one model."""

    hybrid_engine: bool = True  # only True: hyflow always colocates training and generation
    nccl_timeout: int = 600  # seconds a collective of the workers' process group may wait before it fails
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)
