"""Quantities read off the model's logits: the entropy of each next-token distribution, and token log-probs.

Shapes: `logits` (..., V) with V the vocabulary size; `labels` (...) token ids.
"""

from __future__ import annotations

import torch

__all__ = ["entropy_from_logits", "log_probs_from_logits"]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: H = logsumexp(z) − Σ_v softmax(z)_v · z_v.  Shape (...)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] = z_label − logsumexp(z), without materialising the full log-softmax."""
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
