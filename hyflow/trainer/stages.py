"""The controller's data handling around the worker calls of one PPO step: no model weights, only batches.

    batch = new_prompt_batch(batch_dict)                      # DataProto with a `uid` per prompt
    batch = batch.repeat(n, interleave=True)                  # the n samples of a prompt share its uid
    gen_input = generation_input(batch, with_chat=False)      # what the engine / agent loop reads
    batch = merge_generation(batch, rollout_output)           # prompts, responses, masks, ... joined back
    batch, extra = attach_reward(batch, reward_fn)            # token_level_scores + per-row reward extras

Plus the per-step sampling seed (`sampling_seed`), the texts of a batch (`decode_samples`), the rollout dump
(`dump_batch`), the log-prob metrics (`old_log_prob_metrics`), what happens to the engine's log-probs
(`drop_rollout_log_probs`), why the old-log-prob pass is skipped (`skipped_old_log_prob_message`) and the
validation pass (`Validator`).
Shape legend: B rows, P prompt length, R response length.
"""

from __future__ import annotations

import concurrent.futures
import logging
import uuid
from typing import Any

import numpy as np
import torch

from hyflow import fields as F
from hyflow.algorithms import agg_loss
from hyflow.protocol import DataProto
from hyflow.reward import compute_reward
from hyflow.trainer.tracking import dump_generations

__all__ = [
    "GENERATION_INPUTS",
    "Validator",
    "attach_reward",
    "decode_samples",
    "drop_rollout_log_probs",
    "dump_batch",
    "generation_input",
    "merge_generation",
    "new_prompt_batch",
    "object_array",
    "old_log_prob_metrics",
    "reward_extra_metrics",
    "sampling_seed",
    "sequence_scores",
    "skipped_old_log_prob_message",
    "start_reward",
    "store_reward",
]

logger = logging.getLogger(__name__)

# The tensors a rollout reads (left-padded prompts, (B, P)); the rollout returns them widened to (B, P + R).
GENERATION_INPUTS = (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS)


def sampling_seed(seed: int, step: int, index: int = 0) -> int:
    """The sampling seed of generation batch `index` of step `step` of a run seeded with `trainer.seed`."""
    return hash((seed, step, index)) & 0x7FFFFFFF


def new_prompt_batch(batch_dict: dict[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
    """A loader batch as a DataProto, each prompt with a fresh `uid` (its group id once repeated)."""
    batch = DataProto.from_single_dict(batch_dict, meta_info=meta_info)
    batch.non_tensor_batch[F.UID] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    return batch


def generation_input(batch: DataProto, with_chat: bool, meta_info: dict[str, Any]) -> DataProto:
    """The rollout's input: the prompt tensors, `meta_info` and the prompts' `multi_modal_inputs` (if any); with
    `with_chat` (agent loops) also every non-tensor field (raw_prompt, agent_name, tools_kwargs, ...). `batch`
    keeps everything."""
    tensors = batch.select(batch_keys=list(GENERATION_INPUTS))
    non_tensors = dict(batch.non_tensor_batch) if with_chat else {}
    if F.MULTI_MODAL_INPUTS in batch.non_tensor_batch:  # the prompts' images (vision-language models)
        non_tensors[F.MULTI_MODAL_INPUTS] = batch.non_tensor_batch[F.MULTI_MODAL_INPUTS]
    return DataProto(batch=tensors.batch, non_tensor_batch=non_tensors, meta_info=dict(meta_info))


def merge_generation(batch: DataProto, output: DataProto) -> DataProto:
    """`batch` with the rollout's output joined in: the output's tensors replace the prompt-only inputs, and its
    non-tensor fields that `batch` already holds (copied through by the engine) are dropped, except the
    trajectories' `multi_modal_inputs` (an agent loop's tools may have added images), which replace the prompts'."""
    if len(output) != len(batch):
        raise ValueError(f"the rollout returned {len(output)} rows for {len(batch)} prompts; it must return one each.")
    tensors = batch.select(batch_keys=[k for k in batch.batch.keys() if k not in output.batch.keys()])  # noqa: SIM118
    new_non_tensors = {
        k: v for k, v in output.non_tensor_batch.items() if k not in batch.non_tensor_batch or k == F.MULTI_MODAL_INPUTS
    }
    merged = DataProto(
        batch=output.batch,
        non_tensor_batch={**batch.non_tensor_batch, **new_non_tensors},
        meta_info={**batch.meta_info, **{k: v for k, v in output.meta_info.items() if k not in (F.METRICS, F.TIMING)}},
    )
    if tensors.batch is not None and len(tensors.batch.keys()) > 0:
        merged = merged.union(DataProto(batch=tensors.batch))
    return merged


def sequence_scores(token_level: torch.Tensor) -> torch.Tensor:
    """(B,) per-sequence sums of a (B, R) token-level tensor (the score sits on the last valid token)."""
    return token_level.sum(-1)


def attach_reward(batch: DataProto, reward_fn: Any) -> tuple[DataProto, dict[str, list]]:
    """Score `batch` with a reward manager: `token_level_scores` (B, R) and each reward extra (e.g. `acc`) as a
    per-row non-tensor field, so dynamic sampling and the rollout dump can read it."""
    scores, extra_info = compute_reward(batch, reward_fn)
    store_reward(batch, scores, extra_info)
    return batch, extra_info


def start_reward(batch: DataProto, reward_fn: Any, launch_async: bool) -> concurrent.futures.Future | None:
    """Score `batch` now (`attach_reward`; returns None), or with `launch_async` in a thread: the future of
    `compute_reward`'s (scores, extras), for `store_reward` once the log-prob passes are done."""
    if not launch_async:
        attach_reward(batch, reward_fn)
        return None
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = executor.submit(compute_reward, batch, reward_fn)
    executor.shutdown(wait=False)
    return future


def store_reward(batch: DataProto, scores: torch.Tensor, extra_info: dict[str, list]) -> None:
    """Put a reward manager's result into `batch`: the scores, each extra as a column, and their names."""
    batch.batch[F.TOKEN_LEVEL_SCORES] = scores
    for key, values in extra_info.items():
        batch.non_tensor_batch[key] = object_array(values)
    batch.meta_info[F.REWARD_EXTRA_KEYS] = sorted(extra_info)


def reward_extra_metrics(batch: DataProto) -> dict[str, float]:
    """`reward/<failure>_count` and `reward/extra/<name>/mean` of the batch's reward columns (hyflow.reward.metrics)."""
    from hyflow.reward.metrics import reward_metrics

    keys = [key for key in batch.meta_info.get(F.REWARD_EXTRA_KEYS, []) if key in batch.non_tensor_batch]
    return reward_metrics({key: list(batch.non_tensor_batch[key]) for key in keys})


def decode_samples(tokenizer: Any, batch: DataProto) -> tuple[list[str], list[str]]:
    """(prompt texts, response texts) of every row, special tokens removed, padding left out."""
    response_width = batch.batch[F.RESPONSES].shape[-1]
    attention_mask = batch.batch[F.ATTENTION_MASK]
    prompt_ids = batch.batch[F.INPUT_IDS][:, :-response_width]
    prompt_mask = attention_mask[:, :-response_width].bool()
    response_mask = attention_mask[:, -response_width:].bool()
    inputs = [tokenizer.decode(ids[m], skip_special_tokens=True) for ids, m in zip(prompt_ids, prompt_mask)]
    outputs = [
        tokenizer.decode(ids[m], skip_special_tokens=True) for ids, m in zip(batch.batch[F.RESPONSES], response_mask)
    ]
    return inputs, outputs


def dump_batch(dump_dir: str, step: int, tokenizer: Any, batch: DataProto, extra_keys: list[str] | None = None) -> None:
    """Write the batch's generations, scores, ground truths and reward extras to `<dump_dir>/<step>.jsonl`."""
    inputs, outputs = decode_samples(tokenizer, batch)
    scores = sequence_scores(batch.batch[F.TOKEN_LEVEL_SCORES]).tolist()
    reward_info = batch.non_tensor_batch.get(F.REWARD_MODEL, [None] * len(batch))
    truths = [info.get("ground_truth") if isinstance(info, dict) else None for info in reward_info]
    extra = {key: list(batch.non_tensor_batch[key]) for key in extra_keys or [] if key in batch.non_tensor_batch}
    dump_generations(dump_dir, step, inputs, outputs, scores, ground_truths=truths, extra=extra)


def old_log_prob_metrics(batch: DataProto, entropys: torch.Tensor, loss_agg_mode: str) -> dict[str, float]:
    """`actor/entropy` of the sampled responses, and how far the engine's log-probs are from the actor's
    (`training/rollout_probs_diff_{mean,max}` = |p_rollout − p_actor| over response tokens) when it reported them."""
    mask = batch.batch[F.RESPONSE_MASK]
    metrics = {"actor/entropy": agg_loss(entropys, mask, loss_agg_mode)}
    if F.ROLLOUT_LOG_PROBS in batch.batch.keys():  # noqa: SIM118
        valid = mask.bool()
        diff = (batch.batch[F.ROLLOUT_LOG_PROBS].exp() - batch.batch[F.OLD_LOG_PROBS].exp()).abs()[valid]
        if diff.numel() > 0:
            metrics["training/rollout_probs_diff_mean"] = diff.mean()
            metrics["training/rollout_probs_diff_max"] = diff.max()
    names, values = list(metrics), torch.stack(list(metrics.values())).tolist()  # one host sync
    return dict(zip(names, values))


def drop_rollout_log_probs(batch: DataProto, keep: bool) -> DataProto:
    """`batch` without the engine's `rollout_log_probs` unless `keep` (`rollout.calculate_log_probs`: the loss
    reads them); otherwise they are only the old-log-prob pass's diagnostic."""
    if not keep and F.ROLLOUT_LOG_PROBS in batch.batch.keys():  # noqa: SIM118 (TensorDict membership)
        batch.pop(batch_keys=[F.ROLLOUT_LOG_PROBS])
    return batch


def skipped_old_log_prob_message(config: Any) -> str:
    """Why the trainer skips the old-log-prob pass (logged once, when it does)."""
    actor = config.actor_rollout_ref.actor
    if config.algorithm.rollout_correction.bypass_mode:
        return (
            "skipping the old-log-prob pass (algorithm.rollout_correction.bypass_mode=True): old_log_probs are the "
            "engine's rollout_log_probs, so PPO's ratio is taken against the policy that sampled the tokens."
        )
    return (
        f"skipping the old-log-prob pass (actor_rollout_ref.actor.recompute_old_log_prob="
        f"{actor.recompute_old_log_prob}): each batch gets one optimizer step (ppo_epochs={actor.ppo_epochs}, "
        f"ppo_mini_batch_size={actor.ppo_mini_batch_size} = data.train_batch_size={config.data.train_batch_size}) "
        "and nothing reads old_log_probs before it, so the update takes them from its own forward (PPO ratio 1)."
    )


def object_array(values: list[Any]) -> np.ndarray:
    """A 1-D numpy object array holding `values` element by element (lists stay lists)."""
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


class Validator:
    """Generates for the validation set with `rollout.val_kwargs`, scores it, and reports `val-core/...` metrics
    per data source (`hyflow.trainer.validation`), logging `trainer.log_val_generations` samples."""

    def __init__(self, config: Any, tokenizer: Any, loader: Any, reward_fn: Any) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.loader = loader
        self.reward_fn = reward_fn

    def is_due(self, step: int, total_steps: int) -> bool:
        """Every `trainer.test_freq` steps and at the last step; never with test_freq <= 0."""
        test_freq = self.config.trainer.test_freq
        return test_freq > 0 and (step >= total_steps or step % test_freq == 0)

    def _generate_and_score(self, batch_dict: dict[str, Any], generate: Any, rm_group: Any, step: int):
        rollout = self.config.actor_rollout_ref.rollout
        val_kwargs = rollout.val_kwargs
        batch = new_prompt_batch(batch_dict).repeat(val_kwargs.n, interleave=True)
        meta = {
            F.VALIDATE: True,
            F.DO_SAMPLE: val_kwargs.do_sample,
            F.TEMPERATURE: val_kwargs.temperature,
            F.SEED: sampling_seed(self.config.trainer.seed, step, -1),
        }
        output = generate(generation_input(batch, rollout.multi_turn.enable, meta))
        batch = merge_generation(batch, output)
        if rm_group is not None:
            batch = batch.union(rm_group.compute_rm_score(batch))
        scores, extra_info = compute_reward(batch, self.reward_fn)
        return batch, sequence_scores(scores).tolist(), extra_info

    def run(self, generate: Any, rm_group: Any, tracking: Any, step: int) -> dict[str, float]:
        """One pass over the validation set; `generate(DataProto) -> DataProto` is the trainer's rollout."""
        from hyflow.trainer.validation import process_validation_metrics, select_generations_to_log

        sources, uids, scores, inputs, outputs = [], [], [], [], []
        extras: list[tuple[int, dict[str, list]]] = []
        for batch_dict in self.loader:
            batch, batch_scores, extra_info = self._generate_and_score(batch_dict, generate, rm_group, step)
            sources += [str(s) for s in batch.non_tensor_batch[F.DATA_SOURCE]]
            uids += list(batch.non_tensor_batch[F.UID])
            scores += batch_scores
            extras.append((len(batch), extra_info))
            batch_inputs, batch_outputs = decode_samples(self.tokenizer, batch)
            inputs += batch_inputs
            outputs += batch_outputs
        infos: dict[str, list] = {"reward": scores}
        for key in sorted({key for _, info in extras for key in info}):
            infos[key] = [v for rows, info in extras for v in info.get(key, [float("nan")] * rows)]
        trainer = self.config.trainer
        metrics = process_validation_metrics(sources, uids, infos, seed=trainer.seed)
        if trainer.log_val_generations > 0 and tracking is not None:
            samples = select_generations_to_log(inputs, outputs, scores, trainer.log_val_generations)
            tracking.log_generations(samples, step)
        if trainer.validation_data_dir:
            extra = {key: values for key, values in infos.items() if key != "reward"}
            dump_generations(trainer.validation_data_dir, step, inputs, outputs, scores, extra=extra)
        return metrics
