"""The load-balancing auxiliary loss of a mixture-of-experts router, and the expert load it is computed from.

Shape legend: L = MoE layers, N = tokens, E = experts, k = experts per token (top-k).

    aux = load_balancing_loss(router_logits, expert_indices, token_weights)    # (L, N, E), (L, N, k), (N,) -> ()
    load = expert_load(expert_indices, token_weights, num_experts)             # (L, E): weighted assignments

The loss is the Switch Transformer's (Fedus et al. 2021, eq. 4) as transformers computes it for Qwen-MoE and
Mixtral (`load_balancing_loss_func`): over all layers and tokens together,

    aux = E · Σ_e f_e · P_e,   f_e = Σ_{l,t} w_t · #{slots of token t in layer l routed to e} / Σ_{l,t} w_t,
                                P_e = Σ_{l,t} w_t · softmax(z_lt)_e / Σ_{l,t} w_t

with w_t the token weights (1 for a counted token, 0 for padding). f counts the router's top-k choices (no
gradient); P is differentiable, so the gradient pushes router probability away from over-loaded experts. Balanced
routing gives aux = k (f_e = k/E, P_e = 1/E); every token on the same k experts, with all the probability
there, gives aux = E (f_e ≤ 1, Σ_e P_e = 1).
"""

from __future__ import annotations

import torch

__all__ = ["expert_load", "load_balancing_loss"]


def expert_load(expert_indices: torch.Tensor, token_weights: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Per layer, the weighted number of top-k assignments each expert received: (L, N, k), (N,) -> (L, E) fp32.

    Σ_e load[l, e] = k · Σ_t w_t. A scatter-add on the device: no host sync."""
    num_layers, _, top_k = expert_indices.shape
    weights = token_weights.float()[None, :, None].expand(num_layers, -1, top_k)
    load = torch.zeros(num_layers, num_experts, dtype=torch.float32, device=expert_indices.device)
    return load.scatter_add_(1, expert_indices.reshape(num_layers, -1), weights.reshape(num_layers, -1))


def load_balancing_loss(
    router_logits: torch.Tensor, expert_indices: torch.Tensor, token_weights: torch.Tensor
) -> torch.Tensor:
    """aux = E · Σ_e f_e · P_e (see the module docstring) of the router logits (L, N, E) and the experts the router
    chose (L, N, k), over the tokens of weight `token_weights` (N,); a 0-dim fp32 tensor, 0 without weight."""
    num_experts = router_logits.shape[-1]
    total = token_weights.float().sum() * router_logits.shape[0]  # Σ_{l,t} w_t
    fraction = expert_load(expert_indices, token_weights, num_experts).sum(0) / total.clamp_min(1e-12)  # f, (E,)
    probs = torch.softmax(router_logits.float(), dim=-1)  # (L, N, E)
    mean_prob = (probs * token_weights.float()[None, :, None]).sum((0, 1)) / total.clamp_min(1e-12)  # P, (E,)
    return num_experts * (fraction * mean_prob).sum()
