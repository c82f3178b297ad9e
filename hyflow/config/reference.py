"""Generate the configuration reference (`docs/configuration.md`) from the config dataclasses.

    python -m hyflow.config.reference > docs/configuration.md

The dataclasses in `hyflow.config` are the one source of every key and default; this module only reads them. A
key's meaning is, in order of preference: `field(metadata={"doc": ...})`, the comment at the end of the field's
line in the source (`lr: float = 1e-6  # the peak learning rate`), the comment lines directly above the field, or,
for keys whose source has no comment, the short description in `FALLBACK_MEANINGS` below (keyed by
`ClassName.field`). A test (`tests/docs/test_configuration_reference.py`) checks that the committed page equals a
fresh generation and that every key has a meaning, so a new key needs a comment before the docs are regenerated.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Union

from hyflow.config.ppo_trainer import PPOTrainerConfig
from hyflow.config.sft import SFTConfig

__all__ = ["FALLBACK_MEANINGS", "KeyDoc", "field_comments", "iter_key_docs", "main", "render_reference"]

# Meanings of fields whose source line has no comment, keyed by the class that defines the field.
FALLBACK_MEANINGS: dict[str, str] = {
    # common.py
    "WrapPolicyConfig.min_num_params": "also shard, on their own, modules with at least this many parameters (0: off)",
    "MixedPrecisionConfig.param_dtype": "dtype parameters are cast to for forward and backward",
    "MixedPrecisionConfig.reduce_dtype": "dtype gradients are reduced (averaged over ranks) in",
    "MixedPrecisionConfig.buffer_dtype": "dtype of module buffers",
    "FSDPConfig.param_offload": "keep parameters on CPU while the model is not in use",
    "FSDPConfig.optimizer_offload": "keep optimizer state on CPU between updates",
    "FSDPConfig.reshard_after_forward": "free gathered parameters after each forward (FSDP2 `reshard_after_forward`)",
    "FSDPConfig.forward_prefetch": "gather the next module's parameters during the current forward",
    "FSDPConfig.mixed_precision": "FSDP2 mixed-precision dtypes",
    "FSDPConfig.wrap_policy": "which modules are sharded on their own",
    "OptimConfig.lr": "peak learning rate of AdamW",
    "OptimConfig.betas": "AdamW (β1, β2)",
    "OptimConfig.weight_decay": "AdamW decoupled weight decay",
    "OptimConfig.lr_warmup_steps": "linear warmup steps; -1: use lr_warmup_steps_ratio",
    "OptimConfig.lr_warmup_steps_ratio": "warmup length as a share of total_training_steps (when lr_warmup_steps=-1)",
    "OptimConfig.lr_scheduler_type": "learning-rate schedule after warmup",
    "OptimConfig.total_training_steps": "steps the schedule spans; -1: filled in by the trainer",
    "CheckpointConfig.save_contents": "what a checkpoint writes: model shards, optimizer, extra state, an HF copy",
    "CheckpointConfig.load_contents": "what resuming reads back",
    "ModelConfig.path": "local Hugging Face model folder; None: the built-in tiny demo model",
    "ModelConfig.tokenizer_path": "tokenizer folder",
    "ModelConfig.lora_rank": "LoRA rank",
    "FSDPConfig.fsdp_size": "ranks one copy of the model is sharded over",
    "WrapPolicyConfig.transformer_layer_cls_to_wrap": "class names sharded as units",
    "ModelConfig.custom_chat_template": "a Jinja chat template that replaces the tokenizer's",
    "ModelConfig.trust_remote_code": "allow model/tokenizer code shipped in the folder (transformers' flag)",
    "ModelConfig.enable_gradient_checkpointing": "recompute activations in backward to save memory",
    "ModelConfig.use_remove_padding": "accepted for verl compatibility",
    "ModelConfig.lora_alpha": "LoRA scaling numerator (scale = lora_alpha / lora_rank)",
    "ModelConfig.target_modules": "modules that get LoRA adapters (peft's `target_modules`)",
    "ModelConfig.exclude_modules": "modules never given adapters (peft's `exclude_modules`)",
    # actor_rollout_ref.py
    "PolicyLossConfig.clip_cov_ratio": "clip_cov: share of tokens whose gradient is detached",
    "PolicyLossConfig.clip_cov_lb": "clip_cov: lower bound of the covariance window",
    "PolicyLossConfig.clip_cov_ub": "clip_cov: upper bound of the covariance window",
    "PolicyLossConfig.kl_cov_ratio": "kl_cov: share of tokens that get the KL penalty",
    "PolicyLossConfig.ppo_kl_coef": "kl_cov: coefficient of that KL penalty",
    "ActorConfig.strategy": "training backend; fsdp and fsdp2 both mean FSDP2 (`fully_shard`)",
    "ActorConfig.ppo_mini_batch_size": "prompts per optimizer step (× rollout.n rows), over all devices",
    "ActorConfig.ppo_micro_batch_size_per_gpu": "rows per forward/backward on one device",
    "ActorConfig.ppo_max_token_len_per_gpu": "token budget of one micro-batch when use_dynamic_bsz",
    "ActorConfig.ppo_epochs": "passes over each batch of rollouts",
    "ActorConfig.shuffle": "shuffle rows before cutting mini-batches",
    "ActorConfig.grad_clip": "max global gradient norm",
    "ActorConfig.clip_ratio": "PPO clip range ε",
    "ActorConfig.clip_ratio_low": "lower clip ε_low (ratio ≥ 1 − ε_low); None: clip_ratio",
    "ActorConfig.clip_ratio_high": "upper clip ε_high (ratio ≤ 1 + ε_high); None: clip_ratio (DAPO: raise it)",
    "ActorConfig.loss_agg_mode": "how per-token losses are averaged (see `hyflow.algorithms.agg_loss`)",
    "ActorConfig.policy_loss": "policy-loss function and its knobs",
    "ActorConfig.entropy_coeff": "weight of the entropy bonus (loss −= entropy_coeff · entropy)",
    "ActorConfig.kl_loss_coef": "weight of the KL loss term when use_kl_loss",
    "ActorConfig.kl_loss_type": "KL estimator of the KL loss (k1, k2, k3 = low_var_kl, abs, ...)",
    "ActorConfig.optim": "the actor's optimizer and schedule",
    "ActorConfig.fsdp_config": "FSDP2 settings of the actor",
    "ActorConfig.checkpoint": "what the actor's checkpoints hold",
    "SamplingConfig.temperature": "validation sampling temperature (0: greedy)",
    "SamplingConfig.top_k": "validation top-k (-1: off)",
    "SamplingConfig.top_p": "validation top-p (1: off)",
    "SamplingConfig.n": "validation samples per prompt",
    "SamplingConfig.do_sample": "sample during validation (False: greedy)",
    "MultiTurnConfig.enable": "run tool-calling agent rollouts",
    "MultiTurnConfig.max_assistant_turns": "model turns per episode",
    "MultiTurnConfig.max_user_turns": "simulated-user replies per episode; None: no limit",
    "MultiTurnConfig.max_parallel_calls": "tool calls executed per model turn (more are dropped and counted)",
    "MultiTurnConfig.tool_response_truncate_side": "which part of a long tool response is cut",
    "AgentConfig.num_workers": "agent-loop workers that run samples concurrently",
    "RolloutConfig.name": "generation backend: hyflow's engine, or `transformers.generate` (hf)",
    "RolloutConfig.mode": "sync: batch generation; async",
    "RolloutConfig.top_k": "top-k sampling",
    "RolloutConfig.max_model_len": "max tokens of one sequence in the engine",
    "RolloutConfig.temperature": "sampling temperature (log-probs are computed at this temperature)",
    "RolloutConfig.top_p": "nucleus sampling threshold (1: off)",
    "RolloutConfig.do_sample": "sample (False: greedy)",
    "RolloutConfig.ignore_eos": "keep generating past end-of-sequence (benchmarks)",
    "RolloutConfig.prompt_length": "max prompt tokens; None: data.max_prompt_length",
    "RolloutConfig.response_length": "max response tokens; None: data.max_response_length",
    "RolloutConfig.dtype": "compute dtype of the generation engine on GPU",
    "RolloutConfig.max_num_batched_tokens": "token budget of one engine step (prefill chunk)",
    "RolloutConfig.max_num_seqs": "max sequences running at once in the engine",
    "RolloutConfig.tensor_model_parallel_size": "tensor-parallel size of the engine",
    "RolloutConfig.log_prob_micro_batch_size_per_gpu": "rows per forward when computing old log-probs",
    "RolloutConfig.log_prob_use_dynamic_bsz": "cut log-prob micro-batches by token budget",
    "RolloutConfig.log_prob_max_token_len_per_gpu": "token budget of one log-prob micro-batch",
    "RolloutConfig.val_kwargs": "sampling settings of validation",
    "RolloutConfig.multi_turn": "tool-calling agent rollouts",
    "RolloutConfig.agent": "agent-loop manager settings",
    "RefConfig.strategy": "training backend of the reference model",
    "RefConfig.fsdp_config": "FSDP2 settings of the reference model",
    "RefConfig.log_prob_micro_batch_size_per_gpu": "rows per forward when computing ref log-probs",
    "RefConfig.log_prob_use_dynamic_bsz": "cut ref log-prob micro-batches by token budget",
    "RefConfig.log_prob_max_token_len_per_gpu": "token budget of one ref log-prob micro-batch",
    "RefConfig.ulysses_sequence_parallel_size": "only 1: hyflow has no sequence parallelism",
    "ActorRolloutRefConfig.model": "the model the actor, rollout and ref share",
    "ActorRolloutRefConfig.actor": "the trained policy",
    "ActorRolloutRefConfig.rollout": "generation",
    "ActorRolloutRefConfig.ref": "the frozen reference policy",
    # critic.py
    "CriticModelConfig.path": "the value model's folder (the actor's backbone with a value head)",
    "CriticModelConfig.tokenizer_path": "tokenizer folder",
    "CriticModelConfig.fsdp_config": "FSDP2 settings of the critic",
    "CriticConfig.enable": "train a critic",
    "CriticConfig.ppo_micro_batch_size_per_gpu": "rows per forward/backward on one device",
    "CriticConfig.forward_micro_batch_size_per_gpu": "rows per value forward",
    "CriticConfig.forward_max_token_len_per_gpu": "token budget of one value-forward micro-batch",
    "CriticConfig.strategy": "training backend; fsdp and fsdp2 both mean FSDP2",
    "CriticConfig.rollout_n": "samples per prompt (to turn ppo_mini_batch_size prompts into rows)",
    "CriticConfig.model": "the value model",
    "CriticConfig.optim": "the critic's optimizer and schedule",
    "CriticConfig.ppo_mini_batch_size": "prompts per critic optimizer step",
    "CriticConfig.use_dynamic_bsz": "cut micro-batches by token budget",
    "CriticConfig.ppo_max_token_len_per_gpu": "token budget of one training micro-batch",
    "CriticConfig.ppo_epochs": "passes over each batch",
    "CriticConfig.shuffle": "shuffle rows before cutting mini-batches",
    "CriticConfig.grad_clip": "max global gradient norm",
    "CriticConfig.cliprange_value": "value clip range (PPO's clipped value loss)",
    "CriticConfig.loss_agg_mode": "how per-token value losses are averaged",
    "CriticConfig.checkpoint": "what the critic's checkpoints hold",
    # data.py
    "DataConfig.train_files": "training parquet file(s); None: the built-in synthetic demo task",
    "DataConfig.val_files": "validation parquet file(s)",
    "DataConfig.prompt_key": "column holding the chat messages",
    "DataConfig.max_prompt_length": "max prompt tokens after the chat template",
    "DataConfig.max_response_length": "max generated tokens per response",
    "DataConfig.return_raw_input_ids": "keep the unpadded prompt ids in the batch",
    "DataConfig.return_full_prompt": "keep the templated prompt text in the batch",
    "DataConfig.shuffle": "shuffle the training data each epoch",
    "DataConfig.validation_shuffle": "shuffle the validation data",
    "DataConfig.dataloader_num_workers": "DataLoader worker processes",
    "DataConfig.filter_overlong_prompts": "drop prompts longer than max_prompt_length (the count is logged)",
    "DataConfig.filter_overlong_prompts_workers": "processes used to filter",
    "DataConfig.trust_remote_code": "allow tokenizer code shipped in the folder",
    "DataConfig.tokenizer": "tokenizer folder",
    "DataConfig.val_batch_size": "prompts per validation batch",
    "DataConfig.train_max_samples": "use at most this many training rows",
    "DataConfig.val_max_samples": "use at most this many validation rows; -1: all rows",
    "DataConfig.apply_chat_template_kwargs": "extra keyword arguments of `apply_chat_template`",
    # algorithm.py
    "KLControlConfig.type": "fixed β, or adaptive β steered toward target_kl",
    "KLControlConfig.kl_coef": "β, the KL coefficient (initial value when adaptive)",
    "KLControlConfig.horizon": "adaptive: steps over which β moves toward its target",
    "KLControlConfig.target_kl": "adaptive: the KL the controller aims at",
    "FilterGroupsConfig.max_num_gen_batches": "generation batches per step at most",
    "FilterGroupsConfig.enable": "drop groups whose samples all have the same metric value",
    "AlgorithmConfig.adv_estimator": "advantage estimator: a name in the registry",
    "AlgorithmConfig.gamma": "discount factor γ",
    "AlgorithmConfig.lam": "GAE λ",
    "AlgorithmConfig.norm_adv_by_std_in_grpo": "GRPO: divide by the group's std",
    "AlgorithmConfig.use_kl_in_reward": "subtract β·KL(actor ‖ ref) from the token rewards",
    "AlgorithmConfig.kl_penalty": "KL estimator used in the reward",
    "AlgorithmConfig.kl_ctrl": "the KL coefficient controller",
    "AlgorithmConfig.filter_groups": "DAPO dynamic sampling",
    # reward.py
    "OverlongBufferConfig.enable": "penalise responses that run into the buffer before the length limit",
    "OverlongBufferConfig.len": "buffer length in tokens",
    "OverlongBufferConfig.penalty_factor": "penalty at the very end of the buffer",
    "OverlongBufferConfig.log": "log the penalty as a metric",
    "RewardFunctionConfig.name": "function name (in the file, or a built-in component)",
    "RewardFunctionConfig.path": "Python file defining it; None: a built-in component",
    "RewardFunctionConfig.weight": "weight in the sum",
    "RewardFunctionConfig.reward_kwargs": "extra keyword arguments of the function",
    "RewardModelModelConfig.path": "local Hugging Face sequence-classification model folder",
    "RewardModelModelConfig.external_lib": "a module imported before loading",
    "RewardModelModelConfig.trust_remote_code": "allow model code shipped in the folder",
    "RewardModelModelConfig.use_remove_padding": "accepted for verl compatibility",
    "RewardModelModelConfig.fsdp_config": "FSDP2 settings of the reward model",
    "RewardModelConfig.reward_functions": "scorers combined with weights (each entry: a function `name`, the file "
    "`path` defining it or None for a built-in, its `weight`, its `reward_kwargs`)",
    "RewardModelConfig.enable": "score responses with a reward model too",
    "RewardModelConfig.strategy": "backend of the reward model",
    "RewardModelConfig.model": "the reward model",
    "RewardModelConfig.micro_batch_size_per_gpu": "rows per reward-model forward; None: all at once",
    "RewardModelConfig.max_length": "max reward-model input tokens (longer inputs keep their end)",
    "RewardModelConfig.use_dynamic_bsz": "cut reward-model micro-batches by token budget",
    "RewardModelConfig.forward_max_token_len_per_gpu": "token budget of one reward-model micro-batch",
    "RewardModelConfig.reward_manager": "how scorers are called: naive, batch, prime, dapo",
    "RewardModelConfig.overlong_buffer": "dapo: the overlong penalty",
    "CustomRewardFunctionConfig.path": "Python file with your scoring function; None: the built-in scorers",
    "CustomRewardFunctionConfig.name": "name of the function in that file",
    "CustomRewardFunctionConfig.reward_kwargs": "extra keyword arguments passed to it",
    # trainer.py
    "TrainerConfig.backend": "worker-group backend: Ray actors, or in-process",
    "TrainerConfig.total_training_steps": "steps to train",
    "TrainerConfig.default_local_dir": "checkpoint folder",
    "TrainerConfig.max_actor_ckpt_to_keep": "actor checkpoints kept",
    "RayInitConfig.num_cpus": "CPUs of a local Ray cluster",
    "RayInitConfig.address": "address of a running Ray cluster",
    "TrainerConfig.device": "where workers compute",
    "TrainerConfig.nnodes": "machines in the cluster",
    "TrainerConfig.total_epochs": "passes over the training data",
    "TrainerConfig.project_name": "experiment-tracking project",
    "TrainerConfig.experiment_name": "experiment-tracking run name",
    "TrainerConfig.logger": "where metrics go",
    "TrainerConfig.validation_data_dir": "dump validation generations as JSONL here",
    "TrainerConfig.val_before_train": "validate once before the first step",
    "TrainerConfig.val_only": "validate, then stop",
    "TrainerConfig.resume_mode": "auto: latest complete checkpoint; resume_path: resume_from_path; disable",
    "TrainerConfig.resume_from_path": "a global_step_N folder (resume_mode=resume_path)",
    "TrainerConfig.del_local_ckpt_after_load": "delete the checkpoint folder after resuming from it",
    "TrainerConfig.max_critic_ckpt_to_keep": "None: keep all",
    "TrainerConfig.seed": "seed of the run",
    "TrainerConfig.ray_init": "arguments of `ray.init`",
    # sft.py
    "SFTDataConfig.train_files": "training parquet file(s) of chat conversations",
    "SFTDataConfig.val_files": "validation parquet file(s)",
    "SFTDataConfig.messages_key": "column holding the chat messages",
    "SFTDataConfig.tools_key": "column holding the tool schemas, when a row has them",
    "SFTDataConfig.shuffle": "shuffle the training data each epoch",
    "SFTDataConfig.val_max_samples": "use at most this many validation rows; -1: all rows",
    "SFTDataConfig.apply_chat_template_kwargs": "extra keyword arguments of `apply_chat_template`",
    "SFTModelConfig.fsdp_config": "FSDP2 settings of the model",
    "SFTOptimConfig.clip_grad": "max global gradient norm",
    "SFTRunConfig.project_name": "experiment-tracking project",
    "SFTRunConfig.experiment_name": "experiment-tracking run name",
    "SFTRunConfig.total_epochs": "passes over the training data",
    "SFTRunConfig.logger": "where metrics go",
    "SFTRunConfig.device": "where the model trains; auto: CUDA when present, else CPU",
    "SFTRunConfig.seed": "seed of the run",
    "SFTConfig.data": "chat data, lengths and batch sizes",
    "SFTConfig.model": "the model to fine-tune",
    "SFTConfig.optim": "optimizer, schedule and gradient clipping",
    "SFTConfig.checkpoint": "what a checkpoint holds",
    "SFTConfig.trainer": "the loop: length, cadence, output, logging",
    # ppo_trainer.py
    "PPOTrainerConfig.data": "prompt data and batch size",
    "PPOTrainerConfig.actor_rollout_ref": "the hybrid actor / rollout / reference worker",
    "PPOTrainerConfig.critic": "the value model",
    "PPOTrainerConfig.reward_model": "reward managers and the optional reward model",
    "PPOTrainerConfig.custom_reward_function": "a scoring function from your own file",
    "PPOTrainerConfig.algorithm": "advantages and KL in the reward",
    "PPOTrainerConfig.trainer": "the run: devices, logging, validation, checkpoints",
}


# A comment that only explains a special value ("None: ...", "-1: off") rather than the key itself.
VALUE_NOTE = re.compile(r"^(None|-1|0|True|False|empty|local|async|auto):")


@dataclass(frozen=True)
class KeyDoc:
    """One row of the reference: a dotted key, its type in words, its default, its meaning."""

    key: str
    type: str
    default: str
    meaning: str
    is_section: bool


def _comment_text(token_string: str) -> str:
    return token_string.lstrip("#").strip()


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """Field name → its source comment (end of line, else the comment lines just above) in the class body of `cls`."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    end_of_line: dict[int, str] = {}
    whole_line: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        row, col = token.start
        line = token.line
        target = whole_line if not line[:col].strip() else end_of_line
        target[row] = _comment_text(token.string)
    comments: dict[str, str] = {}
    class_node = ast.parse(source).body[0]
    assert isinstance(class_node, ast.ClassDef)
    for node in class_node.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = end_of_line.get(node.end_lineno or node.lineno) or end_of_line.get(node.lineno)
        if text is None:
            above, row = [], node.lineno - 1
            while row in whole_line:
                above.insert(0, whole_line[row])
                row -= 1
            text = " ".join(above) or None
        text = _strip_lint_codes(text or "")
        if text:
            comments[node.target.id] = text
    return comments


def _strip_lint_codes(text: str) -> str:
    """Drop `noqa: XXX (why)` parts: they are for linters, not readers."""
    if text.startswith("noqa"):
        return ""
    return text.split("  # noqa")[0].strip()


def _declaring_classes(cls: type, name: str) -> list[type]:
    """The classes of `cls`'s MRO whose own body declares field `name`, nearest first."""
    return [klass for klass in cls.__mro__ if name in vars(klass).get("__annotations__", {})]


def field_meaning(cls: type, f: dataclasses.Field) -> str:
    """The meaning of one field (see the module docstring for the order of sources).

    A subclass that re-declares a field only to change its default (e.g. SFT's `optim.lr`) keeps the meaning
    written on the base class: the classes of the MRO that declare the field are searched nearest first.
    """
    if f.metadata.get("doc"):
        return str(f.metadata["doc"])
    for owner in _declaring_classes(cls, f.name):
        comment = field_comments(owner).get(f.name, "")
        fallback = FALLBACK_MEANINGS.get(f"{owner.__name__}.{f.name}", "")
        if comment and fallback and VALUE_NOTE.match(comment):
            return f"{fallback}; {comment}"  # the comment only explains a special value: say what the key is first
        if comment or fallback:
            return comment or fallback
    return ""


def describe_hint(hint: Any) -> str:
    """A type annotation as a short string: `int | None`, `"fixed" | "adaptive"`, `list[str]`."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " | ".join(describe_hint(arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return " | ".join(f'"{arg}"' if isinstance(arg, str) else repr(arg) for arg in typing.get_args(hint))
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join(describe_hint(arg) for arg in typing.get_args(hint))}]"
    if hint is type(None):
        return "None"
    if hint is Any:
        return "Any"
    if dataclasses.is_dataclass(hint):  # an entry of a list, e.g. reward_functions: {name, path, weight, ...}
        return "{" + ", ".join(f.name for f in dataclasses.fields(hint)) + "}"
    return getattr(hint, "__name__", str(hint))


def _section_class(hint: Any) -> type | None:
    """The dataclass a field holds (through `X | None`), or None for a leaf."""
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(options) == 1 and dataclasses.is_dataclass(options[0]):
            return options[0]
    return None


def describe_default(f: dataclasses.Field, value: Any) -> str:
    """The default as the command line would write it; inherited and derived fields say where they come from."""
    if "inherit" in f.metadata:
        return f"= `{f.metadata['inherit']}`"  # rendered: = `data.max_prompt_length`
    if f.metadata.get("derived"):
        return "derived"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (list, dict)) and not value:
        return f"`{value!r}`"
    if isinstance(value, (list, dict)):
        return "`" + repr(value).replace("'", '"') + "`"
    return f"`{value!r}`"


def iter_key_docs(cls: type = PPOTrainerConfig, prefix: str = "") -> Iterator[KeyDoc]:
    """Every key of `cls`, depth first, sections included (a section's row comes before its keys)."""
    hints = typing.get_type_hints(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        hint = hints[f.name]
        section = _section_class(hint)
        meaning = field_meaning(cls, f)
        if section is not None:
            yield KeyDoc(key, "section", "", meaning, is_section=True)
            yield from iter_key_docs(section, key)
        else:
            yield KeyDoc(key, describe_hint(hint), describe_default(f, getattr(instance, f.name)), meaning, False)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _section_intro(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _section_classes(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        section = _section_class(hints[f.name])
        if section is not None:
            key = f"{prefix}.{f.name}" if prefix else f.name
            yield key, section
            yield from _section_classes(section, key)


HEADER = """# Configuration reference

<!-- Generated by `python -m hyflow.config.reference > docs/configuration.md`; do not edit by hand. -->

Every key of `python -m hyflow.trainer.main_ppo` (and `hyflow train`), with its type, default and meaning, then
[every key of `hyflow sft`](#sft-hyflow-sft). The PPO keys are verl's, so a verl launch line works as written
(see [Port a verl launch script](howto/port_verl.md)). Set a key on the command line as `section.key=value`, a list
as `key=[a,b]`, and a new entry of a mapping-valued key with a leading `+`
(`+custom_reward_function.reward_kwargs.bonus=0.5`). The whole config is checked when it is loaded: an unknown key
gets the closest valid key as a suggestion, a wrong type or a value outside its choices names the allowed values,
and cross-field rules (batch sizes that must divide, `rollout.n > 1` for group estimators, a critic for `gae`) are
checked before any worker starts.

In the default column, `= other.key` means the key takes that key's value when left unset (verl's `${...}`
interpolation), and `derived` means its section computes it from sibling keys (the meaning says how). Micro-batch
sizes ending in `_per_gpu` are per device and count rows; `ppo_mini_batch_size` counts prompts, each sampled
`rollout.n` times.

Print the composed config of a launch line with `python -m hyflow.trainer.main_ppo --cfg job key=value ...`.
"""

# (title, root dataclass, suffix of its section headings): the PPO config first, then the SFT one.
PARTS: tuple[tuple[str, type, str], ...] = (
    ("PPO and GRPO: `hyflow train`", PPOTrainerConfig, ""),
    ("SFT: `hyflow sft`", SFTConfig, " (sft)"),
)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    return "".join(ch for ch in heading.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def _table(rows: list[KeyDoc], suffix: str) -> list[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for row in rows:
        name = row.key.rpartition(".")[2]
        if row.is_section:
            lines.append(f"| [`{name}`](#{_slug(f'`{row.key}`{suffix}')}) | section | | {_escape(row.meaning)} |")
        else:
            lines.append(f"| `{name}` | `{_escape(row.type)}` | {_escape(row.default)} | {_escape(row.meaning)} |")
    return lines


def _render_part(title: str, root: type, suffix: str) -> list[str]:
    """One root config: a line of links to its top sections, then one table per section."""
    sections = dict(_section_classes(root))
    by_section: dict[str, list[KeyDoc]] = {key: [] for key in sections}
    for row in iter_key_docs(root):
        parent = row.key.rpartition(".")[0]
        if parent in by_section:
            by_section[parent].append(row)
    top = [key for key in sections if "." not in key]
    out = [f"## {title}\n", " · ".join(f"[`{key}`](#{_slug(f'`{key}`{suffix}')})" for key in top) + "\n"]
    for key, cls in sections.items():
        out.append(f"{'#' * min(3 + key.count('.'), 5)} `{key}`{suffix}\n")
        intro = _section_intro(cls)
        if intro:
            out.append(f"{intro}\n")
        out.extend([*_table(by_section[key], suffix), ""])
    return out


def render_reference() -> str:
    """The whole Markdown page: for each root config, one table per section, in the order of the dataclasses."""
    out = [HEADER]
    for title, root, suffix in PARTS:
        out.extend(_render_part(title, root, suffix))
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the reference to stdout."""
    sys.stdout.write(render_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
