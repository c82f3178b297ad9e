"""The policy as the training engine sees it: a causal LM whose forward returns response log-probs, not logits.

Shape legend: B = batch, P = prompt length, R = response length, T = P + R, H = hidden size, V = vocabulary,
N = B·R response positions.

    policy = PolicyModel(causal_lm)
    log_probs, entropy = policy(input_ids, attention_mask, position_ids, responses, temperature=1.0,
                                compute_entropy=True)                                    # (B, R), (B, R)

Why a wrapper: the LM head runs on the response positions only, in chunks of `chunk_size` positions, so the fp32
(B, T, V) logits never exist at once; under autograd each chunk is checkpointed, so backward keeps only the hidden
states and recomputes one chunk's logits at a time. It is also the module FSDP2 shards at the root, so one root
forward covers the backbone and the head (the head's weight may be tied to the embedding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_CHUNK_SIZE = 1024  # response positions per LM-head chunk: chunk_size × V × 4 bytes of fp32 logits


def _chunk_logits(hidden, weight, bias, temperature: float) -> torch.Tensor:
    """z = (h Wᵀ + b) / temperature in fp32, for one chunk of positions: (n, H) → (n, V)."""
    logits = F.linear(hidden, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


class _LinearLogProbs(torch.autograd.Function):
    """Chunked LM head + log-softmax + gather (+ entropy) with a hand-written backward.

    Forward, per chunk of positions, with z = (h Wᵀ + b) / T in fp32 and p = softmax(z):
        log p(y) = z_y − logsumexp(z)           H = logsumexp(z) − Σ_v p_v z_v
    Backward recomputes the chunk's logits (only h, W, the labels and two (N,) vectors are saved) and uses
        ∂log p(y)/∂z = onehot(y) − p            ∂H/∂z = −p ⊙ (log p + H)
    so each chunk costs a handful of in-place passes over an (n, V) fp32 buffer instead of autograd's chain of
    gather / logsumexp / softmax backward kernels, and no (N, V) tensor outlives its chunk.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, compute_entropy, chunk_size):
        log_probs = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        log_normalizers = torch.empty_like(log_probs)
        entropy = torch.zeros_like(log_probs)
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            logits = _chunk_logits(hidden[rows], weight, bias, temperature)
            log_normalizer = torch.logsumexp(logits, dim=-1)
            log_normalizers[rows] = log_normalizer
            log_probs[rows] = logits.gather(-1, labels[rows].unsqueeze(-1)).squeeze(-1) - log_normalizer
            if compute_entropy:
                probs = torch.softmax(logits, dim=-1)
                entropy[rows] = log_normalizer - (probs * logits).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, bias, labels, log_normalizers, entropy)
        ctx.temperature, ctx.compute_entropy, ctx.chunk_size = temperature, compute_entropy, chunk_size
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, bias, labels, log_normalizers, entropy = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        needs_bias_grad = bias is not None and ctx.needs_input_grad[2]
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if needs_bias_grad else None
        use_entropy = ctx.compute_entropy and grad_entropy is not None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            g_lp = grad_log_probs[rows].unsqueeze(-1)
            log_p = _chunk_logits(hidden[rows], weight, bias, ctx.temperature).sub_(log_normalizers[rows, None])
            probs = log_p.exp()
            if use_entropy:  # −p ⊙ (g_lp + g_H · (log p + H))
                coeff = log_p.add_(entropy[rows, None]).mul_(grad_entropy[rows, None]).add_(g_lp)
                grad_logits = probs.mul_(coeff).neg_()
            else:  # −p · g_lp
                grad_logits = probs.mul_(g_lp).neg_()
            grad_logits.scatter_add_(-1, labels[rows].unsqueeze(-1), g_lp)
            if ctx.temperature != 1.0:
                grad_logits.div_(ctx.temperature)
            if grad_bias is not None:
                grad_bias += grad_logits.sum(dim=0)
            grad_logits = grad_logits.to(weight.dtype)  # matmuls in the compute dtype (bf16 under FSDP2 on CUDA)
            if grad_hidden is not None:
                grad_hidden[rows] = (grad_logits @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += (grad_logits.t() @ hidden[rows].to(weight.dtype)).float()
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def log_probs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position log-probs (and entropy) of `labels` under `softmax((hidden Wᵀ + b) / temperature)`, chunked.

    hidden (N, H), weight (V, H), labels (N,) → two (N,) fp32 tensors (entropy is zeros unless asked for). At most
    one chunk of `chunk_size` × V fp32 logits exists at a time, in forward and in backward.
    """
    return _LinearLogProbs.apply(hidden, weight, bias, labels, temperature, compute_entropy, chunk_size)


class PolicyModel(nn.Module):
    """Wraps a Hugging Face causal LM (or a peft model around one); forward gives response log-probs."""

    def __init__(self, lm: nn.Module, chunk_size: int = DEFAULT_CHUNK_SIZE):
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size

    @property
    def config(self):
        return self.lm.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        responses: torch.Tensor,
        temperature: float = 1.0,
        compute_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, response_length = responses.shape
        hidden = self.lm.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        # The token at position t is predicted from the hidden state at t − 1.
        hidden = hidden[:, -response_length - 1 : -1].reshape(batch_size * response_length, -1)
        head = self.lm.get_output_embeddings()
        log_probs, entropy = log_probs_from_hidden(
            hidden, head.weight, responses.reshape(-1), temperature, compute_entropy, self.chunk_size, head.bias
        )
        # reshape(...).clone(): FSDP2 warns about (and mishandles in-place ops on) root outputs that are views.
        log_probs = log_probs.reshape(batch_size, response_length).clone()
        return log_probs, (entropy.reshape(batch_size, response_length).clone() if compute_entropy else None)
