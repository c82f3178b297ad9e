"""PF-PPO: policy filtration by reward, as a resampling of the batch before the update.

Gu et al. 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation" (arXiv:2409.06957), in verl's
form: each response's weight comes from its sequence score s_i = Σ_t token_level_scores[i, t],

    pow:        w_i = |s_i| ** weight_pow
    max_min:    w_i = 1 if s_i is the batch's maximum or minimum, else 0
    max_random: w_i = 0.4 if s_i is the batch's maximum, else 0.1

and the batch of B rows is replaced by B rows drawn with replacement with probability ∝ max(w_i + 1e-8, 1e-8),
so responses whose reward is more reliable are trained on more often.
"""

from __future__ import annotations

from typing import Literal

import torch

ReweightMethod = Literal["pow", "max_min", "max_random"]


def pf_ppo_weights(scores: torch.Tensor, reweight_method: ReweightMethod, weight_pow: float) -> torch.Tensor:
    """The unnormalised sampling weight of each row (B,) from its sequence score (B,); see the module docstring."""
    if reweight_method == "pow":
        return scores.abs().pow(weight_pow)
    if reweight_method == "max_min":
        return ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    if reweight_method == "max_random":
        return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    raise ValueError(
        f"algorithm.pf_ppo.reweight_method={reweight_method!r} is not a PF-PPO method. "
        "Fix: use one of 'pow', 'max_min', 'max_random'."
    )


@torch.no_grad()
def pf_ppo_sample_indices(
    scores: torch.Tensor,
    reweight_method: ReweightMethod = "pow",
    weight_pow: float = 2.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """B row indices (B,) drawn with replacement, with probability ∝ the PF-PPO weight of each row."""
    weights = torch.clamp(pf_ppo_weights(scores.float(), reweight_method, weight_pow) + 1e-8, min=1e-8)
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)
