"""Masked statistics over response tokens: sum, mean, variance and whitening.

Shapes: `values` and `mask` broadcast together, typically (B, T) with T the response length; `mask` is 1 on
tokens that count (model tokens) and 0 on padding and tool/observation tokens. These helpers never sync with
the host, so they are safe inside micro-batch loops.
"""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_sum", "masked_var", "masked_whiten"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask over `axis` (all elements when `axis` is None)."""
    product = values * mask
    return product.sum() if axis is None else product.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask over `axis`; an all-zero mask gives 0 instead of NaN."""
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / count.clamp_min(1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements: mean((x - mean(x))²), times n/(n-1) when `unbiased` (Bessel).

    With n <= 1 valid elements the Bessel correction is skipped, so the result is 0 rather than NaN.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        variance = variance * count / (count - 1).clamp_min(1.0)
    return variance


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, epsilon: float = 1e-8
) -> torch.Tensor:
    """Whiten with the statistics of the masked elements: (x - mean) / sqrt(var + epsilon).

    `var` is the unbiased masked variance. With `shift_mean=False` the mean is added back, so only the scale
    changes. Positions outside the mask are transformed too (callers multiply by the mask when it matters).
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask, unbiased=True) + epsilon)
    return whitened if shift_mean else whitened + mean
