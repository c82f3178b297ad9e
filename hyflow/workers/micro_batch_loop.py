"""The micro-batch loops that `DataParallelPPOActor` and `DataParallelPPOCritic` share.

    outputs, bins = forward_without_grad(module, batch, ForwardSettings(micro_batch_size=8), device, forward)
    metrics = run_ppo_epochs(module, optimizer, batch, config, mini_batch_size=..., seed=..., device=...,
                             metric_prefix="actor", micro_batch_loss=loss_fn)            # the update

One optimizer step per mini-batch: cut it into micro-batches (a fixed size, or a token budget with
`use_dynamic_bsz`), count its tokens and sequences over all ranks (`global_counts`, so each micro-batch's loss is
normalised by the whole mini-batch and the micro-batch losses add up to the mini-batch loss), accumulate the
gradients, clip, step. Metrics stay tensors on the device and reach the host once per update
(`reduce_metrics_across_ranks`). Each micro-batch is trimmed to the columns that hold tokens and copied to the device
(`micro_batch_on_device`); for a module that removes padding it is packed on the host first, so no forward waits
for the device and the host queues the next micro-batch's kernels while the device still runs the last one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from hyflow import fields as F
from hyflow.models.packing import PackedRows, pack_rows
from hyflow.workers.batching import split_micro_batches, split_mini_batches, to_device, trim_padding
from hyflow.workers.fsdp import is_distributed, reshard, set_gradient_accumulation, training_device
from hyflow.workers.optim import clip_grad_norm_and_step

logger = logging.getLogger(__name__)

__all__ = [
    "ForwardSettings",
    "accumulate_and_step",
    "forward_without_grad",
    "global_counts",
    "micro_batch_on_device",
    "reduce_metrics_across_ranks",
    "run_ppo_epochs",
    "warn_about_skipped_steps",
]


@dataclass(frozen=True)
class ForwardSettings:
    """How a forward-only pass (old / ref log-probs, values) runs, given by the worker from its role's config: rows
    per micro-batch, or a token budget per micro-batch (`use_dynamic_bsz`), and the temperature that divides the
    logits (log-probs only: the rollout's, so they are the log-probs of the sampling distribution)."""

    micro_batch_size: int | None = None  # None: the whole batch in one micro-batch
    max_token_len: int | None = None  # set: cut by this token budget instead of by micro_batch_size
    temperature: float = 1.0


MicroBatchLoss = Callable[[TensorDict, PackedRows | None, dict[str, Any]], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def micro_batch_on_device(
    micro: TensorDict, module: torch.nn.Module, device: torch.device
) -> tuple[TensorDict, PackedRows | None]:
    """A host micro-batch trimmed to the columns that hold tokens and copied to `device`, with its packing (its
    response tokens too) when `module.remove_padding`: packed from the host mask, so the forward never syncs."""
    micro = trim_padding(micro)
    packed = None
    if getattr(module, "remove_padding", False):
        response_length = micro[F.RESPONSES].shape[-1] if F.RESPONSES in micro.keys() else None  # noqa: SIM118
        packed = pack_rows(micro[F.ATTENTION_MASK], response_length).to(device)
    return to_device(micro, device), packed


def global_counts(response_mask: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(tokens, sequences with at least one token, dp size) of the mini-batch summed over all ranks."""
    counts = to_device(torch.stack([response_mask.sum(), (response_mask.sum(-1) > 0).sum()]).float(), device)
    dp_size = 1
    if is_distributed():
        dist.all_reduce(counts)  # one collective per mini-batch; no host sync
        dp_size = dist.get_world_size()
    return counts[0], counts[1], dp_size


def reduce_metrics_across_ranks(step_metrics: list[dict[str, torch.Tensor]]) -> dict[str, list[float]]:
    """Sum each metric's per-rank contributions over ranks (one all-reduce) and bring them to the host once."""
    if not step_metrics:
        return {}
    names = sorted(step_metrics[0])
    device = next((v.device for v in step_metrics[0].values() if v.device.type != "cpu"), torch.device("cpu"))
    on_device = [torch.stack([m[name].detach().float().to(device) for name in names]) for m in step_metrics]
    stacked = torch.stack(on_device).cpu()  # host sync: once per update, after the last optimizer step
    summed = torch.tensor([not name.endswith(("grad_norm", "lr", "num_skipped_steps")) for name in names])
    if is_distributed():
        reduced = (stacked * summed).to(training_device() if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(reduced)
        stacked = torch.where(summed, reduced.cpu(), stacked)
    values = stacked.tolist()
    return {name: [row[i] for row in values] for i, name in enumerate(names)}


def forward_without_grad(
    module: torch.nn.Module,
    batch: TensorDict,
    settings: ForwardSettings,
    device: torch.device,
    forward: Callable[[TensorDict, PackedRows | None], Any],
) -> tuple[list[Any], list[list[int]]]:
    """`forward` of each micro-batch in eval mode: (outputs, bins); `restore_order(outputs, bins)` gives row order.

    The micro-batches are cut as `settings` says: `micro_batch_size` rows, or `max_token_len` tokens when set. Each
    reaches `forward(micro, packed)` as `micro_batch_on_device` gives it. The module's train/eval mode is restored.
    """
    micro_batches, bins = split_micro_batches(batch, settings.micro_batch_size, settings.max_token_len)
    was_training = module.training
    module.eval()
    with torch.no_grad():
        outputs = [forward(*micro_batch_on_device(micro, module, device)) for micro in micro_batches]
    reshard(module)
    module.train(was_training)
    return outputs, bins


def accumulate_and_step(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mini: TensorDict,
    config: Any,
    device: torch.device,
    metric_prefix: str,
    micro_batch_loss: MicroBatchLoss,
) -> dict[str, torch.Tensor]:
    """One optimizer step: accumulate gradients over the micro-batches of `mini`, then clip and step.

    `micro_batch_loss(micro, packed, agg_kwargs)` gets each micro-batch as `micro_batch_on_device` gives it, and
    the mini-batch's global counts for `agg_loss` (`dp_size`, `batch_num_tokens`, `global_batch_size`,
    `loss_scale_factor`); it returns the micro-batch's share of the loss and its metric contributions, which are summed.
    `config` is the actor or critic config (`ppo_micro_batch_size_per_gpu`, `use_dynamic_bsz`,
    `ppo_max_token_len_per_gpu`, `grad_clip`); `metric_prefix` names the step's own metrics
    (`<metric_prefix>/grad_norm`, `/num_skipped_steps`, `/lr`).
    """
    max_token_len = config.ppo_max_token_len_per_gpu if config.use_dynamic_bsz else None
    micro_batches, _ = split_micro_batches(mini, config.ppo_micro_batch_size_per_gpu, max_token_len)
    num_tokens, num_seqs, dp_size = global_counts(mini[F.RESPONSE_MASK], device)
    agg_kwargs = {
        "batch_num_tokens": num_tokens,
        "global_batch_size": num_seqs,
        "loss_scale_factor": mini[F.RESPONSES].shape[-1],
        "dp_size": dp_size,
    }
    optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=device))
    for index, micro in enumerate(micro_batches):
        loss, micro_metrics = micro_batch_loss(*micro_batch_on_device(micro, module, device), agg_kwargs)
        set_gradient_accumulation(module, is_last_micro_batch=index == len(micro_batches) - 1)
        loss.backward()
        for name, value in micro_metrics.items():
            metrics[name] = metrics[name] + value
    grad_norm, skipped = clip_grad_norm_and_step(module, optimizer, config.grad_clip)
    metrics[f"{metric_prefix}/grad_norm"] = grad_norm
    metrics[f"{metric_prefix}/num_skipped_steps"] = skipped
    metrics[f"{metric_prefix}/lr"] = torch.tensor(optimizer.param_groups[0]["lr"])
    return dict(metrics)


def run_ppo_epochs(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TensorDict,
    config: Any,
    *,
    mini_batch_size: int,
    seed: int,
    device: torch.device,
    metric_prefix: str,
    micro_batch_loss: MicroBatchLoss,
) -> dict[str, list[float]]:
    """`config.ppo_epochs` passes over `batch` in mini-batches (shuffled with `seed` when `config.shuffle`), one
    `accumulate_and_step` each; returns every metric with one value per optimizer step, summed over ranks."""
    generator = torch.Generator().manual_seed(seed)
    step_metrics = []
    for _ in range(config.ppo_epochs):
        for mini in split_mini_batches(batch, mini_batch_size, config.shuffle, generator):
            step_metrics.append(
                accumulate_and_step(module, optimizer, mini, config, device, metric_prefix, micro_batch_loss)
            )
    metrics = reduce_metrics_across_ranks(step_metrics)
    warn_about_skipped_steps(metrics.get(f"{metric_prefix}/num_skipped_steps", []), metric_prefix)
    return metrics


def warn_about_skipped_steps(skipped: list[float], metric_prefix: str) -> None:
    """One warning for the optimizer steps of an update that a non-finite gradient norm skipped."""
    if any(skipped):
        logger.warning(
            "%s: %d of %d optimizer step(s) skipped: the gradient norm was NaN or inf (%s/num_skipped_steps); "
            "parameters and optimizer state were left as they were",
            metric_prefix, int(sum(skipped)), len(skipped), metric_prefix,
        )  # fmt: skip
