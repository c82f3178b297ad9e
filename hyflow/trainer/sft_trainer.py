"""`SFTTrainer`: supervised fine-tuning on chat conversations, loss on assistant tokens only, with FSDP2.

    trainer = SFTTrainer(load_sft_config(["data.train_files=train.parquet", "model.path=/models/tiny"]))
    history = trainer.fit()                     # one dict of metrics per optimizer step
    # -> checkpoints/<project>/<experiment>/global_step_N/actor   (the actor's checkpoint format)
    # -> checkpoints/<project>/<experiment>/huggingface           (actor_rollout_ref.model.path for PPO)

One process per device; `torchrun --nproc_per_node=N -m hyflow.trainer.main_sft ...` runs data-parallel with the
model sharded by FSDP2 (NCCL on CUDA, gloo on CPU); one process runs the plain model. The model, optimizer, LR
schedule and checkpoints come from the training engine (`hyflow.workers`: builders, fsdp, optim, checkpoint), so an
SFT checkpoint is an actor checkpoint (`hyflow merge` turns it into a Hugging Face folder).

One optimizer step takes `data.train_batch_size` conversations (each rank holds its share, cut into micro-batches
of `data.micro_batch_size_per_gpu` for gradient accumulation). The loss is the token mean of the negative
log-likelihood over the assistant tokens of the whole global batch:

    loss = −(1/N) Σ_b Σ_t m_bt · log p(x_bt | x_b,<t),   N = Σ_b Σ_t m_bt over all ranks' rows of the step

so the update does not depend on how the batch is cut into micro-batches or ranks (`agg_loss`, token-mean).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from hyflow import fields as F
from hyflow.algorithms import agg_loss
from hyflow.config.sft import SFTConfig
from hyflow.data.sampler import ResumableSampler
from hyflow.data.sft_dataset import LOSS_MASK, SFTDataset, collate_sft
from hyflow.models.lora import merged_hf_weights
from hyflow.models.multimodal import auto_model_class
from hyflow.models.processor import copy_processor_files, load_processor
from hyflow.trainer.checkpoint_manager import ACTOR_DIR, StepCheckpoints
from hyflow.trainer.checkpoint_save import failed_save_reported
from hyflow.trainer.tracking import Tracking
from hyflow.workers import builders
from hyflow.workers.checkpoint import ShardCheckpointer
from hyflow.workers.fsdp import build_device_mesh, is_distributed, iter_full_state, reshard, training_device
from hyflow.workers.micro_batch_loop import warn_about_skipped_steps
from hyflow.workers.optim import clip_grad_norm_and_step

logger = logging.getLogger(__name__)

HF_DIR = "huggingface"  # under trainer.default_local_dir: the final model as a Hugging Face folder
StepCallback = Callable[[int, dict[str, float]], bool | None]


def init_distributed_from_env() -> None:
    """Join the process group that `torchrun` describes (WORLD_SIZE > 1); one process needs none."""
    if is_distributed() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def _all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if is_distributed():
        dist.all_reduce(tensor)
    return tensor


def _check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device='cuda' but no CUDA device is visible; use trainer.device=auto or cpu.")
    if device == "cpu" and torch.cuda.is_available():
        raise ValueError(
            "trainer.device='cpu' but CUDA devices are visible to this process; hide them with "
            "CUDA_VISIBLE_DEVICES= (the `hyflow sft` command does this for you), or use trainer.device=auto."
        )


class SFTTrainer:
    """Builds the data, model and optimizer from an `SFTConfig`; `fit()` trains, validates and saves."""

    def __init__(self, config: SFTConfig) -> None:
        # LoRA from a saved adapter (model.lora_adapter_path) takes the adapter's rank, alpha and targets
        self.config = config = dataclasses.replace(config, model=builders.with_adapter_settings(config.model))
        _check_device(config.trainer.device)
        init_distributed_from_env()
        self.rank = dist.get_rank() if is_distributed() else 0
        self.world_size = dist.get_world_size() if is_distributed() else 1
        self.device = training_device()
        torch.manual_seed(config.trainer.seed)
        model_config = config.model
        builders.import_external_lib(model_config)
        path = builders.model_path(model_config, "model")
        self.model_path = path  # its processor files travel into checkpoints (vision-language models)
        self.tokenizer = builders.tokenizer_for(model_config, path, "model")
        if model_config.custom_chat_template:
            self.tokenizer.chat_template = model_config.custom_chat_template
        self._build_data()
        self.steps = StepCheckpoints(config.trainer.default_local_dir, config.trainer.max_ckpt_to_keep)
        if self.rank == 0:
            self.steps.ensure_writable()  # a bad default_local_dir fails before the model loads
        mesh = build_device_mesh()
        self.module = builders.build_policy(model_config, model_config.fsdp_config, mesh, path, trainable=True)
        optim_config = dataclasses.replace(config.optim, total_training_steps=self.total_steps)
        self.optimizer, self.lr_scheduler = builders.build_optimizer_and_scheduler(self.module, optim_config)
        checkpoint = config.checkpoint
        self.shards = ShardCheckpointer(
            self.module, self.optimizer, self.lr_scheduler, checkpoint.save_contents, checkpoint.load_contents
        )
        self.global_step = 0
        self.num_saved = 0  # checkpoints this trainer wrote

    # ---- data ----
    def _build_data(self) -> None:
        data, trainer = self.config.data, self.config.trainer
        if data.train_files is None:
            raise ValueError(
                "data.train_files=None: set it to a parquet file of chat conversations (data.messages_key)."
            )
        if data.train_batch_size % self.world_size:
            raise ValueError(
                f"data.train_batch_size={data.train_batch_size} cannot be split evenly over {self.world_size} ranks; "
                "make it a multiple of the number of processes."
            )
        processor = load_processor(self.model_path, self.config.model.trust_remote_code)
        self.train_set = SFTDataset(data.train_files, self.tokenizer, data, data.train_max_samples, processor)
        self.val_set = (
            SFTDataset(data.val_files, self.tokenizer, data, data.val_max_samples, processor)
            if data.val_files
            else None
        )
        self.steps_per_epoch = len(self.train_set) // data.train_batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"data.train_batch_size={data.train_batch_size} is larger than the training set "
                f"({len(self.train_set)} conversations); lower data.train_batch_size or add data."
            )
        self.total_steps = trainer.total_training_steps or self.steps_per_epoch * trainer.total_epochs
        self.sampler = ResumableSampler(len(self.train_set), data.shuffle, trainer.seed)

    def _collate(self, dataset: SFTDataset, indices: list[int]) -> dict[str, torch.Tensor]:
        return collate_sft([dataset[i] for i in indices], self.tokenizer.pad_token_id)

    def train_batch(self, step: int) -> dict[str, torch.Tensor]:
        """This rank's share of the global batch of optimizer step `step` (0-based): rows rank, rank + W, ..."""
        size = self.config.data.train_batch_size
        epoch, offset = divmod(step, self.steps_per_epoch)
        order = self.sampler.epoch_order(epoch)
        return self._collate(self.train_set, order[offset * size : (offset + 1) * size][self.rank :: self.world_size])

    def _micro_batches(self, batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """Micro-batches on the device, each cut to its own longest row (lengths are read on the CPU, no sync)."""
        size = self.config.data.micro_batch_size_per_gpu
        lengths = batch[F.ATTENTION_MASK].sum(-1)
        micro_batches = []
        for start in range(0, lengths.numel(), size):
            rows = slice(start, start + size)
            length = max(2, int(lengths[rows].max()))
            micro = {k: v[rows, ..., :length].to(self.device, non_blocking=True) for k, v in _tensors(batch).items()}
            if F.MULTI_MODAL_INPUTS in batch:  # per-row images (a list), concatenated by the policy's forward
                micro[F.MULTI_MODAL_INPUTS] = batch[F.MULTI_MODAL_INPUTS][rows]
            micro_batches.append(micro)
        return micro_batches

    # ---- the loss ----
    def _token_log_probs(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(x_t | x_<t) for t = 1..L−1 and the matching loss mask, both (b, L−1)."""
        input_ids = micro[F.INPUT_IDS]
        log_probs, _ = self.module(
            input_ids,
            micro[F.ATTENTION_MASK],
            micro[F.POSITION_IDS],
            input_ids[:, 1:],
            multi_modal_inputs=micro.get(F.MULTI_MODAL_INPUTS),
        )
        return log_probs, micro[LOSS_MASK][:, 1:].to(log_probs.dtype)

    def train_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One optimizer step: gradient accumulation over micro-batches, loss normalised by the global token count."""
        self.module.train()
        micro_batches = self._micro_batches(batch)
        num_tokens = _all_reduce_sum(batch[LOSS_MASK][:, 1:].sum().float().to(self.device))
        total_loss = torch.zeros((), device=self.device)
        for micro in micro_batches:
            log_probs, mask = self._token_log_probs(micro)
            loss = agg_loss(-log_probs, mask, "token-mean", batch_num_tokens=num_tokens, dp_size=self.world_size)
            loss.backward()
            total_loss += loss.detach() / self.world_size
        grad_norm, skipped = clip_grad_norm_and_step(self.module, self.optimizer, self.config.optim.clip_grad)
        lr = self.optimizer.param_groups[0]["lr"]
        self.lr_scheduler.step()
        return {
            "train/loss": _all_reduce_sum(total_loss),
            "train/grad_norm": grad_norm,
            "train/lr": torch.tensor(lr),
            "train/num_tokens": num_tokens,
            "train/num_skipped_steps": skipped,
        }

    @torch.no_grad()
    def validate(self) -> dict[str, torch.Tensor]:
        """Token-mean NLL of the assistant tokens of the validation set (every rank runs as many micro-batches)."""
        assert self.val_set is not None
        self.module.eval()
        indices = list(range(len(self.val_set)))
        per_rank = -(-len(indices) // self.world_size)
        padded = indices + [0] * (per_rank * self.world_size - len(indices))  # padding rows get no weight
        weights = torch.tensor([1] * len(indices) + [0] * (len(padded) - len(indices)))
        mine = list(range(self.rank, len(padded), self.world_size))
        batch = self._collate(self.val_set, [padded[i] for i in mine])
        batch[LOSS_MASK] = batch[LOSS_MASK] * weights[mine].unsqueeze(-1)
        sums = torch.zeros(2, device=self.device)
        for micro in self._micro_batches(batch):
            log_probs, mask = self._token_log_probs(micro)
            sums += torch.stack([-(log_probs * mask).sum(), mask.sum()])
        reshard(self.module)
        sums = _all_reduce_sum(sums)
        return {"val/loss": sums[0] / sums[1].clamp_min(1)}

    # ---- the loop ----
    def fit(self, on_step: StepCallback | None = None) -> list[dict[str, float]]:
        """Train for `total_steps` optimizer steps (resuming first when a checkpoint says so); returns the metrics
        of every step. `on_step(step, metrics)` runs on every rank after each step (e.g. a progress line); when it
        returns True, training stops there (it must answer the same on every rank; the metrics are global)."""
        trainer = self.config.trainer
        self.resume()
        tracking = None
        if self.rank == 0:
            tracking = Tracking(
                trainer.project_name, trainer.experiment_name, trainer.logger, self.config, trainer.log_dir
            )
        history: list[dict[str, float]] = []
        saved_before = self.num_saved
        progress = tqdm(
            total=self.total_steps, initial=self.global_step, desc="sft", unit="step", disable=self.rank != 0
        )
        with logging_redirect_tqdm():  # log lines print above the bar, never onto it
            while self.global_step < self.total_steps:
                start = time.perf_counter()
                metrics = self.train_step(self.train_batch(self.global_step))
                self.global_step += 1
                step, last = self.global_step, self.global_step == self.total_steps
                if self.val_set is not None and (last or (trainer.test_freq > 0 and step % trainer.test_freq == 0)):
                    metrics.update(self.validate())
                values = {name: float(value) for name, value in metrics.items()}  # host sync: once per step
                warn_about_skipped_steps([values["train/num_skipped_steps"]], "train")
                values["timing_s/step"] = time.perf_counter() - start
                values["train/epoch"] = (step - 1) // self.steps_per_epoch
                history.append(values)
                if tracking is not None:
                    tracking.log(values, step)
                progress.update(1)
                stop = bool(on_step(step, values)) if on_step is not None else False
                last = last or stop
                if trainer.save_freq != 0 and (last or (trainer.save_freq > 0 and step % trainer.save_freq == 0)):
                    self.save_checkpoint()
                if stop:
                    logger.info("SFT stopped early at step %d of %d", step, self.total_steps)
                    break
        progress.close()
        if trainer.save_hf_model:
            self.save_hf_model(os.path.join(trainer.default_local_dir, HF_DIR))
        if self.num_saved == saved_before and history and self.rank == 0:
            logger.warning(_no_checkpoint_message(self.config, len(history)))
        if tracking is not None:
            tracking.finish()
        return history

    # ---- checkpoints ----
    def save_checkpoint(self) -> Path:
        """`global_step_N/actor` in the actor's format, then the step is marked complete (atomically)."""
        step = self.global_step
        with failed_save_reported(self.steps.root, step, keep_key="trainer.max_ckpt_to_keep"):  # a full disk: one error
            path = self.steps.step_dir(step) if self.rank == 0 else Path(self.steps.root) / f"global_step_{step}"
            if is_distributed():
                dist.barrier()
            lm = self.module.lm
            info = {"kind": "policy", "global_step": step, "lora": builders.lora_info(self.config.model)}
            info["source"] = "sft"
            generation_config = getattr(_base_lm(lm), "generation_config", None)
            assets = builders.hf_assets_saver(lm.config, self.tokenizer, generation_config, self.model_path)
            self.shards.save(path / ACTOR_DIR, info=info, hf_assets=assets)
            if self.rank == 0:
                epoch, offset = divmod(step, self.steps_per_epoch)
                self.steps.finalize(step, {"epoch": epoch, "step_in_epoch": offset})
        if is_distributed():
            dist.barrier()
        self.num_saved += 1
        return path

    def resume(self) -> None:
        """Continue from the checkpoint `trainer.resume_mode` picks: weights, optimizer, schedule and the step."""
        trainer = self.config.trainer
        state = self.steps.resume(trainer.resume_mode, trainer.resume_from_path)
        if state is None:
            return
        self.shards.load(state.path / ACTOR_DIR)
        self.global_step = state.global_step
        logger.info("SFT resumes after step %d of %d", self.global_step, self.total_steps)

    def save_hf_model(self, folder: str | os.PathLike) -> str:
        """Write the trained model (LoRA folded in) as a Hugging Face folder that `from_pretrained` loads."""
        model_config = self.config.model
        scaling = model_config.lora_alpha / model_config.lora_rank if model_config.lora_rank > 0 else 0.0
        state = {}
        for name, tensor in merged_hf_weights(iter_full_state(self.module), scaling):  # every rank joins
            if self.rank == 0:
                state[name] = tensor.detach().to("cpu", copy=True)
        folder = os.fspath(folder)
        if self.rank == 0:
            write_hf_folder(_base_lm(self.module.lm), state, self.tokenizer, folder, self.model_path)
        if is_distributed():
            dist.barrier()
        return folder


def _no_checkpoint_message(config: SFTConfig, num_steps: int) -> str:
    """What a run that trained `num_steps` steps and saved no checkpoint says when it ends."""
    trainer = config.trainer
    saved = (
        f"the trained model is the Hugging Face folder {os.path.join(trainer.default_local_dir, HF_DIR)}"
        if trainer.save_hf_model
        else "with trainer.save_hf_model=False no model was written either"
    )
    return (
        f"this run trained {num_steps} step(s) and saved no checkpoint (trainer.save_freq={trainer.save_freq}: 0 "
        f"saves none; -1, the default, saves one at the end), so it cannot be resumed; {saved}."
    )


def _tensors(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensor fields of an SFT batch (a vision-language batch also holds a list of per-row images)."""
    return {key: value for key, value in batch.items() if isinstance(value, torch.Tensor)}


def _base_lm(lm: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a peft wrapper (or the model itself)."""
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


def write_hf_folder(
    lm: torch.nn.Module,
    state: dict[str, torch.Tensor],
    tokenizer: Any,
    folder: str,
    processor_source: str | None = None,
) -> None:
    """Save `state` (full tensors under Hugging Face names) as a model of `lm`'s class and config, atomically;
    a vision-language model's processor files are copied from the folder `processor_source`."""
    import shutil

    with torch.device("meta"):
        model = auto_model_class(lm.config).from_config(lm.config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(lm.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
    if missing:
        model.tie_weights()
    model.generation_config = getattr(lm, "generation_config", model.generation_config)
    tmp = folder.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if processor_source is not None:
        copy_processor_files(processor_source, tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)
    logger.info("saved the SFT model as a Hugging Face folder: %s", folder)
