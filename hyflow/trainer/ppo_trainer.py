"""`PPOTrainer`: the single controller. `fit()` is the RL dataflow as a plain loop over prompt batches.

    config = load_config([...])                  # or python -m hyflow.trainer.main_ppo key=value ...
    run(config)                                   # = PPOTrainer(config).init_workers(); .fit()

One step (`train_step`), each stage timed (`timing_s/<stage>`):

    prompts ─ uid per prompt, repeat rollout.n ─ gen (engine or agent loop) ─ reward ─ old_log_prob
      ─ rollout_correction ─ ref ─ teacher_log_prob (distillation) ─ values ─ KL in reward (or scores as
      rewards) ─ adv (+ distillation's reverse-KL advantages) ─ update_critic
      ─ update_actor ─ metrics

The old_log_prob stage is skipped when the update is exactly on-policy (one optimizer step per batch and nothing
else reading the old log-probs, `PPOTrainerConfig.recompute_old_log_prob`): the update then takes them from its
own forward, and `timing_s/old_log_prob` is absent from the step's metrics.

then validation every `trainer.test_freq` steps, the step's metrics line, and a checkpoint every
`trainer.save_freq` steps (and at the end; none with -1, the default, and a run that saved none says so): the line
is written before the checkpoint, so a run killed right after a save never lacks the metrics of the step it resumes
after (the save's duration goes to the log, not the line).
ReMax adds a greedy baseline rollout before repeating; DAPO's dynamic sampling (`algorithm.filter_groups`)
generates and scores more batches until enough groups with varying rewards are found (`_training_batches`).
Split placement and the asynchronous modes (`trainer.placement`, `async_training.mode`) keep this loop: the
batches come from `hyflow.trainer.async_rollout.SplitRollout`, which also moves the weights to the rollout pool.
The controller holds no weights: the math here is the light, batch-level kind (`ppo_ops`, `metrics`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from hyflow import fields as F
from hyflow.algorithms import get_kl_controller
from hyflow.config import PPOTrainerConfig
from hyflow.data.sampler import build_prompt_loader
from hyflow.protocol import DataProto
from hyflow.reward import compute_reward, load_reward_manager
from hyflow.trainer import off_policy, stages
from hyflow.trainer.async_rollout import SplitRollout
from hyflow.trainer.balance import balance_batch, generate_balanced
from hyflow.trainer.checkpoint_manager import StepCheckpoints
from hyflow.trainer.distillation_stage import distill_advantages
from hyflow.trainer.dynamic_sampling import GroupFilter
from hyflow.trainer.metrics import reduce_metrics, timer
from hyflow.trainer.placement import WorkerGroups, build_worker_groups
from hyflow.trainer.ppo_checkpoint import (
    is_save_step,
    no_checkpoint_message,
    resume_ppo_checkpoint,
    save_ppo_checkpoint,
)
from hyflow.trainer.ppo_ops import compute_response_mask, step_advantages
from hyflow.trainer.shutdown import close_reward_processes, ray_is_running, shutdown_ray
from hyflow.trainer.stages import Validator
from hyflow.trainer.step_metrics import compute_step_metrics
from hyflow.trainer.tracking import Tracking

__all__ = ["PPOTrainer", "run"]

logger = logging.getLogger(__name__)


def run(config: PPOTrainerConfig) -> dict[str, float]:
    """Train with a checked config (the entry `main_ppo` calls); returns the last step's metrics. On the way out,
    also after an error or a stop, everything the run started ends, in order: `close()`, then Ray when this run
    started it (`hyflow.trainer.shutdown`)."""
    ray_was_running = ray_is_running()
    trainer = PPOTrainer(config)
    try:
        trainer.init_workers()
        return trainer.fit()
    finally:
        trainer.close()
        if not ray_was_running:
            shutdown_ray()


class PPOTrainer:
    """Builds data, rewards and trackers from the config (checking them before any worker starts), then drives
    the worker groups. `fit()` returns the metrics of the last step (validation included)."""

    def __init__(self, config: PPOTrainerConfig, tokenizer: Any = None) -> None:
        from hyflow.models.loader import load_tokenizer

        self.config = config
        model = config.actor_rollout_ref.model
        key, tokenizer_path = config.tokenizer_source
        if tokenizer is None and tokenizer_path is None:
            raise ValueError(
                "actor_rollout_ref.model.path=None: set it to a local Hugging Face model folder (or leave out both "
                "the model and data.train_files for the embedded default, which builds a tiny model and trains it)."
            )
        trust = model.trust_remote_code
        self.tokenizer = tokenizer or load_tokenizer(tokenizer_path, trust_remote_code=trust, key=key)
        self.processor = self._processor()
        data, processor = config.data, self.processor
        self.train_loader = build_prompt_loader(data.train_files, self.tokenizer, data, train=True, processor=processor)
        self.total_training_steps = self._total_training_steps()
        config.actor_rollout_ref.actor.optim.total_training_steps = self.total_training_steps
        config.critic.optim.total_training_steps = self.total_training_steps
        self.reward_fn = load_reward_manager(config, self.tokenizer, num_examine=0)
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl)
        self.group_filter = GroupFilter.from_config(config)  # None unless algorithm.filter_groups.enable
        trainer = config.trainer
        self.checkpoints = StepCheckpoints(
            trainer.default_local_dir, trainer.max_actor_ckpt_to_keep, trainer.max_critic_ckpt_to_keep
        )
        self.checkpoints.ensure_writable()  # a bad default_local_dir fails now, not at the first save
        self.validator: Validator | None = None
        if data.val_files:
            val_loader = build_prompt_loader(data.val_files, self.tokenizer, data, train=False, processor=processor)
            val_reward_fn = load_reward_manager(config, self.tokenizer, num_examine=1)
            self.validator = Validator(config, self.tokenizer, val_loader, val_reward_fn)
        self.workers: WorkerGroups | None = None
        self.split: SplitRollout | None = None  # trainer.placement=split
        self.agent_manager: Any = None
        self.tracking: Tracking | None = None
        self.global_step = 0
        self.saved_steps: list[int] = []  # the steps this run saved a checkpoint of
        self._hf_config: Any = None
        self._rollout_metrics: dict[str, float] = {}
        self.recompute_old_log_prob = config.recompute_old_log_prob
        if not self.recompute_old_log_prob:
            logger.info(stages.skipped_old_log_prob_message(config))

    # ---- set-up -----------------------------------------------------------------------------------------
    def _processor(self) -> Any:
        """The model folder's processor for a vision-language model (None for a text-only one)."""
        from hyflow.models.processor import load_processor

        model, data = self.config.actor_rollout_ref.model, self.config.data
        if model.path is None:
            return None
        return load_processor(model.path, model.trust_remote_code, data.min_pixels, data.max_pixels)

    def _total_training_steps(self) -> int:
        trainer = self.config.trainer
        return trainer.total_training_steps or len(self.train_loader) * trainer.total_epochs

    def init_workers(self) -> None:
        """Start the worker groups (models load here), the agent-loop manager and the trackers."""
        from hyflow.models.loader import load_model_config

        config = self.config
        self.workers = build_worker_groups(config)
        if config.actor_rollout_ref.rollout.multi_turn.enable:
            from hyflow.agent import AgentLoopManager

            servers = self.workers.rollout_servers()  # one per rollout worker; a conversation stays on one
            rollout = config.actor_rollout_ref.rollout
            template_kwargs = config.data.apply_chat_template_kwargs  # the prompts as the dataset renders them
            self.agent_manager = AgentLoopManager(rollout, self.tokenizer, servers, self.processor, template_kwargs)
        if config.trainer.placement == "split":
            loader, manager = self.train_loader, self.agent_manager
            self.split = SplitRollout(config, self.workers, self._generate_batch, loader, agent_manager=manager)
        model = config.actor_rollout_ref.model
        self._hf_config = load_model_config(model.path, model.override_config, model.trust_remote_code)
        trainer = config.trainer
        self.tracking = Tracking(trainer.project_name, trainer.experiment_name, trainer.logger, config=config)

    def close(self) -> None:
        """End what the trainer started: trackers, rollout threads, worker groups, then the reward processes."""
        if self.tracking is not None:
            self.tracking.finish()
        if self.split is not None:
            self.split.close()
        if self.workers is not None:
            self.workers.shutdown()
        close_reward_processes(self.reward_fn)
        if self.validator is not None:
            close_reward_processes(self.validator.reward_fn)

    # ---- the loop ---------------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Resume → validate → train `total_training_steps` steps → the last step's metrics."""
        assert self.workers is not None and self.tracking is not None, "call init_workers() first"
        trainer = self.config.trainer
        self._load_checkpoint()
        if self.split is not None:
            self.split.start(version=self.global_step)
        metrics: dict[str, float] = {}
        if self.validator is not None and (trainer.val_before_train or trainer.val_only):
            metrics = self.validator.run(self._generate, self.workers.reward_model, self.tracking, self.global_step)
            self.tracking.log(metrics, step=self.global_step)
            if trainer.val_only:
                return metrics
        if self.global_step >= self.total_training_steps:
            logger.info("already at step %d of %d: nothing to train", self.global_step, self.total_training_steps)
            return metrics
        first_step = self.global_step
        bar = tqdm(total=self.total_training_steps, initial=self.global_step, desc="training", unit="step")
        # the bar closes on any way out (a stop, an error), so nothing prints after the last line of the run;
        # log lines, like the console table, print above the bar, never onto it
        with bar as progress, logging_redirect_tqdm():
            for epoch, batch, timing, started in self._training_batches():
                self.global_step += 1
                batch, metrics = self.train_step(batch, timing)
                if self.split is not None:
                    self.split.after_update(self.global_step, timing)
                metrics.update(self._validate_if_due(timing))
                timing["step"] = time.perf_counter() - started
                metrics.update(self._step_metrics(batch, timing, epoch))
                self.tracking.log(metrics, step=self.global_step)  # before the checkpoint (module docstring)
                self._save_if_due()
                progress.update(1)
                if self.global_step >= self.total_training_steps:
                    break
        if not self.saved_steps:
            logger.warning(no_checkpoint_message(trainer, self.global_step - first_step))
        return metrics

    def _training_batches(self) -> Iterator[tuple[int, DataProto, dict[str, float], float]]:
        """(epoch, generated batch, timing so far, start time) per training step, across epochs; with dynamic
        sampling, several generation batches are generated and scored for one training batch; asynchronous modes
        take them from `SplitRollout`."""
        batches = self.split.batches(lambda: self.global_step) if self.split is not None else None
        if batches is not None:
            yield from batches
            return
        timing: dict[str, float] = {}
        started, num_gen_batches = time.perf_counter(), 0
        while self.train_loader.epoch < self.config.trainer.total_epochs:
            epoch = self.train_loader.epoch
            for batch_dict in self.train_loader:
                seed = stages.sampling_seed(self.config.trainer.seed, self.global_step + 1, num_gen_batches)
                batch = self._rollout(stages.new_prompt_batch(batch_dict), timing, seed)
                num_gen_batches += 1
                if self.group_filter is not None:
                    with timer("reward", timing):
                        batch, _ = stages.attach_reward(self._with_rm_scores(batch), self.reward_fn)
                    batch = self.group_filter.add(batch)
                    if batch is None:
                        continue
                    batch.meta_info[F.GLOBAL_TOKEN_NUM] = batch.batch[F.ATTENTION_MASK].sum(-1).tolist()
                yield epoch, batch, timing, started
                timing, started, num_gen_batches = {}, time.perf_counter(), 0
        logger.info("all %d epochs done at step %d", self.config.trainer.total_epochs, self.global_step)

    def _rollout(self, batch: DataProto, timing: dict[str, float], seed: int) -> DataProto:
        batch, generation_timing, self._rollout_metrics = self._generate_batch(batch, seed)
        timing.update(generation_timing)
        return batch

    def _generate_batch(self, batch: DataProto, seed: int) -> tuple[DataProto, dict[str, float], dict[str, float]]:
        """Generate `rollout.n` responses per prompt (after ReMax's greedy baseline, when it is the estimator);
        `seed` fixes the sampling, so a resumed run samples what an uninterrupted one would. Returns the batch,
        the generation's timing and the workers' rollout metrics, and changes no trainer state (asynchronous
        modes call it from another thread)."""
        timing: dict[str, float] = {}
        rollout = self.config.actor_rollout_ref.rollout
        if self.config.algorithm.adv_estimator == "remax":
            with timer("gen_max", timing):
                batch.batch[F.REWARD_BASELINES] = self._greedy_baseline(batch)
        batch = batch.repeat(rollout.n, interleave=True)
        meta = {F.TEMPERATURE: rollout.temperature, F.DO_SAMPLE: rollout.do_sample, F.SEED: seed}
        with timer("gen", timing):
            output = self._generate(stages.generation_input(batch, self.agent_manager is not None, meta), rollout.n)
        rollout_metrics = reduce_metrics(output.meta_info.get(F.METRICS, {}))  # per rank: turns, graphs, ...
        timing.update(output.meta_info.get(F.TIMING, {}))  # the worker's phases: gen/rollout_mode, gen/generate, ...
        batch = stages.merge_generation(batch, output)
        if F.RESPONSE_MASK not in batch.batch.keys():  # noqa: SIM118
            batch.batch[F.RESPONSE_MASK] = compute_response_mask(batch)
        batch.meta_info[F.GLOBAL_TOKEN_NUM] = batch.batch[F.ATTENTION_MASK].sum(-1).tolist()
        return batch, timing, rollout_metrics

    def _generate(self, gen_input: DataProto, group_size: int = 1) -> DataProto:
        """The rollout worker group, or the agent loops over the engine (multi-turn), for one batch of prompts (with
        `trainer.balance_batch`, whole groups of `group_size` rows spread evenly over the engines)."""
        if self.agent_manager is None:
            if not self.config.trainer.balance_batch:
                return self.workers.rollout.generate_sequences(gen_input)
            tp_size = self.config.actor_rollout_ref.rollout.tensor_model_parallel_size
            return generate_balanced(self.workers.rollout, gen_input, tp_size, group_size)
        self.workers.rollout.rollout_mode()  # every worker's engine gets the actor's latest weights
        try:
            return self.agent_manager.generate_sequences(gen_input)
        finally:
            self.workers.rollout.trainer_mode()

    def _greedy_baseline(self, batch: DataProto) -> torch.Tensor:
        """ReMax (Li et al. 2023, arXiv:2310.10505): the reward of one greedy response per prompt, (B,)."""
        meta = {F.DO_SAMPLE: False, F.GLOBAL_STEPS: self.global_step}
        output = self._generate(stages.generation_input(batch, self.agent_manager is not None, meta))
        greedy = self._with_rm_scores(stages.merge_generation(batch, output))
        scores, _ = compute_reward(greedy, self.reward_fn)
        return stages.sequence_scores(scores)

    def _with_rm_scores(self, batch: DataProto) -> DataProto:
        """Add the reward model's `rm_scores` when `reward_model.enable` (the manager adds them to rule scores)."""
        if self.workers.reward_model is None or F.RM_SCORES in batch.batch.keys():  # noqa: SIM118
            return batch
        return batch.union(self.workers.reward_model.compute_rm_score(batch))

    # ---- one step ---------------------------------------------------------------------------------------
    def train_step(self, batch: DataProto, timing: dict[str, float]) -> tuple[DataProto, dict[str, Any]]:
        """Reward → old/ref log-probs → values → advantages → critic and actor updates, on a generated batch;
        returns the batch with every field filled in, and the step's worker metrics."""
        config = self.config
        metrics: dict[str, Any] = {}
        if config.trainer.balance_batch:
            batch, _, balance_metrics = balance_batch(batch, self.workers.world_size)
            metrics.update(balance_metrics)
        reward_future = self._start_reward(batch, timing)
        if self.recompute_old_log_prob:  # else the actor update takes them from its own forward (on-policy)
            with timer("old_log_prob", timing):
                batch = self._old_log_probs(batch, metrics)
        batch = stages.drop_rollout_log_probs(batch, keep=config.actor_rollout_ref.rollout.calculate_log_probs)
        batch, correction_metrics = off_policy.correct(batch, config.algorithm.rollout_correction)
        metrics.update(correction_metrics)  # rollout_corr/* (decoupled mode)
        if config.use_reference_policy:
            with timer("ref", timing):
                batch = batch.union(self.workers.actor_rollout.compute_ref_log_prob(batch))
        if config.distillation.enabled:
            with timer("teacher_log_prob", timing):
                batch = batch.union(self.workers.teacher.compute_teacher_log_prob(batch))
        if config.use_critic:
            with timer("values", timing):
                batch = batch.union(self.workers.critic.compute_values(batch))
        with timer("adv", timing):
            if reward_future is not None:
                with timer("reward_wait", timing):
                    stages.store_reward(batch, *reward_future.result())
            batch = step_advantages(batch, config.algorithm, self.kl_ctrl, config.actor_rollout_ref.rollout.n, metrics)
            if config.distillation.enabled:
                batch = distill_advantages(batch, config.distillation.distillation_loss, metrics)
        if config.use_critic:
            with timer("update_critic", timing):
                metrics.update(reduce_metrics(self.workers.critic.update_critic(batch).meta_info[F.METRICS]))
        if self.global_step > config.trainer.critic_warmup:  # the first critic_warmup steps train only the critic
            batch.meta_info[F.GLOBAL_STEPS] = self.global_step
            with timer("update_actor", timing):
                metrics.update(reduce_metrics(self.workers.actor_rollout.update_actor(batch).meta_info[F.METRICS]))
        if config.trainer.rollout_data_dir:
            with timer("dump_rollout_generations", timing):
                extra = [k for k in ("acc", "format", "pred") if k in batch.non_tensor_batch]
                stages.dump_batch(config.trainer.rollout_data_dir, self.global_step, self.tokenizer, batch, extra)
        return batch, metrics

    def _start_reward(self, batch: DataProto, timing: dict[str, float]) -> concurrent.futures.Future | None:
        """Score now, or (reward_model.launch_reward_fn_async) in a thread while the log-probs are computed."""
        if F.TOKEN_LEVEL_SCORES in batch.batch.keys():  # noqa: SIM118 (dynamic sampling scored it already)
            return None
        with timer("reward", timing):
            launch_async = self.config.reward_model.launch_reward_fn_async
            return stages.start_reward(self._with_rm_scores(batch), self.reward_fn, launch_async)

    def _old_log_probs(self, batch: DataProto, metrics: dict[str, Any]) -> DataProto:
        output = self.workers.actor_rollout.compute_log_prob(batch)
        entropys = output.batch[F.ENTROPYS]
        routing = [F.ROUTED_EXPERTS] if F.ROUTED_EXPERTS in output.batch.keys() else []  # noqa: SIM118 (R2)
        batch = batch.union(output.select(batch_keys=[F.OLD_LOG_PROBS, *routing]))
        loss_agg_mode = self.config.actor_rollout_ref.actor.loss_agg_mode
        metrics.update(stages.old_log_prob_metrics(batch, entropys, loss_agg_mode))
        return batch

    # ---- after the update -------------------------------------------------------------------------------
    def _validate_if_due(self, timing: dict[str, float]) -> dict[str, float]:
        """Validation metrics every `trainer.test_freq` steps and at the last step ({} otherwise)."""
        step = self.global_step
        if self.validator is None or not self.validator.is_due(step, self.total_training_steps):
            return {}
        if self.split is not None:
            self.split.before_validation(step)
        with timer("testing", timing):
            return self.validator.run(self._generate, self.workers.reward_model, self.tracking, step)

    def _save_if_due(self) -> None:
        """A checkpoint when `trainer.save_freq` asks for one (`is_save_step`); its duration goes to the log."""
        step = self.global_step
        if is_save_step(self.config.trainer, step, self.total_training_steps):
            started = time.perf_counter()
            self.save_checkpoint()
            self.saved_steps.append(step)
            logger.info("checkpoint of step %d saved in %.1f s", step, time.perf_counter() - started)

    def _step_metrics(self, batch: DataProto, timing: dict[str, float], epoch: int) -> dict[str, float]:
        """The trainer's own counters (step, epoch, rollout workers, async, dynamic sampling), then the batch's."""
        metrics = {"training/global_step": float(self.global_step), "training/epoch": float(epoch)}
        metrics.update(self._rollout_metrics)
        if self.split is not None:
            metrics.update(self.split.step_metrics(batch, self.global_step - 1, timing))
        if self.group_filter is not None:
            metrics.update(self.group_filter.last_metrics)
        metrics.update(compute_step_metrics(self.config, batch, timing, self._hf_config, self.workers.world_size))
        return metrics

    # ---- checkpoints (ppo_checkpoint.py) ----------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Workers write their shards into `global_step_N/{actor,critic}`, then the trainer state marks it done."""
        save_ppo_checkpoint(
            self.checkpoints, self.workers, self.global_step, self.kl_ctrl, self.train_loader, self.split
        )

    def _load_checkpoint(self) -> None:
        workers, trainer = self.workers, self.config.trainer
        step = resume_ppo_checkpoint(self.checkpoints, trainer, workers, self.kl_ctrl, self.train_loader)
        if step is not None:
            self.global_step = step
