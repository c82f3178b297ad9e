"""The policy as the training engine sees it: a causal LM whose forward returns response log-probs, not logits.

Shape legend: B = batch, P = prompt length, R = response length, T = P + R, H = hidden size, V = vocabulary,
N = B·R response positions.

    policy = PolicyModel(causal_lm)
    log_probs, entropy = policy(input_ids, attention_mask, position_ids, responses, temperature=1.0,
                                compute_entropy=True)                                    # (B, R), (B, R)

A vision-language model (Qwen2-VL & co., `AutoModelForImageTextToText`) takes `multi_modal_inputs` too: one dict
per row (`pixel_values` (n_i, D), `image_grid_thw` (k_i, 3)), concatenated in row order for the batch, and
`position_ids` (B, 3, T), the M-RoPE rows; its vision tower runs inside the same forward.

Why a wrapper: the LM head runs on the response positions only, in chunks of `chunk_size` positions, so the
(B, T, V) logits never exist at once; under autograd each chunk is checkpointed, so backward keeps only the hidden
states and recomputes one chunk's logits at a time. It is also the module FSDP2 shards at the root, so one root
forward covers the backbone and the head (the head's weight may be tied to the embedding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hyflow.engine.routing_cache import no_record_value, routing_dtype
from hyflow.models.kernels.dispatch import use_triton
from hyflow.models.multimodal import (
    batch_vision_inputs,
    check_videos_supported,
    is_vision_language,
    vision_encoder_outputs,
    vision_language_backbone,
)
from hyflow.models.packing import PackedRows, forward_packed, pack_rows, use_varlen_attention
from hyflow.models.router_replay import RouterReplay

DEFAULT_CHUNK_SIZE = 1024  # torch reference: chunk_size × V × 4 bytes of fp32 logits, twice in backward
# Fused path: one (n, V) buffer in the compute dtype (bf16), overwritten in place by its gradient. 1 GiB is about
# the reference's peak at 1024 rows for a 152k vocabulary, and gives ~3.5k rows per chunk: 3× fewer launches.
FUSED_CHUNK_BYTES = 1 << 30


def default_chunk_size(vocab_size: int, dtype: torch.dtype, fused: bool) -> int:
    """Rows per LM-head chunk: 1024 for the fp32 reference; for the fused kernels as many rows as fit one
    `FUSED_CHUNK_BYTES` buffer of logits in `dtype` (a multiple of 128, at least 128)."""
    if not fused:
        return DEFAULT_CHUNK_SIZE
    rows = FUSED_CHUNK_BYTES // (vocab_size * torch.empty((), dtype=dtype).element_size())
    return max(128, rows // 128 * 128)


def _chunk_logits(hidden, weight, bias, temperature: float) -> torch.Tensor:
    """z = (h Wᵀ + b) / temperature in fp32, for one chunk of positions: (n, H) → (n, V)."""
    logits = F.linear(hidden, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def _chunk_stats(hidden, weight, bias, labels, temperature: float, compute_entropy: bool, fused: bool):
    """(log p(y), logsumexp(z), H) of one chunk, each (n,) fp32; H is zeros unless `compute_entropy`."""
    if fused:  # one Triton pass over the compute-dtype logits; temperature applied as it reads
        from hyflow.models.kernels import triton_lm_head  # only where Triton is installed

        return triton_lm_head.logits_stats(F.linear(hidden, weight, bias), labels, temperature, compute_entropy)
    logits = _chunk_logits(hidden, weight, bias, temperature)
    log_normalizer = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_normalizer
    entropy = torch.zeros_like(log_normalizer)
    if compute_entropy:
        entropy = log_normalizer - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return log_probs, log_normalizer, entropy


def _chunk_grad_logits(hidden, weight, bias, labels, log_normalizer, entropy, g_lp, g_h, temperature, fused):
    """∂L/∂logits of one chunk, (n, V): [(onehot(y) − p)·g_lp − g_H·p·(log p + H)] / T, with the recomputed
    logits. Fused: in the compute dtype, written by one Triton pass over the logits buffer; reference: fp32."""
    if fused:
        from hyflow.models.kernels import triton_lm_head  # only where Triton is installed

        logits = F.linear(hidden, weight, bias)
        use_entropy = g_h is not None
        return triton_lm_head.grad_logits_(logits, labels, log_normalizer, entropy, g_lp, g_h, temperature, use_entropy)
    g_lp = g_lp.unsqueeze(-1)
    log_p = _chunk_logits(hidden, weight, bias, temperature).sub_(log_normalizer[:, None])
    probs = log_p.exp()
    if g_h is not None:  # −p ⊙ (g_lp + g_H · (log p + H))
        coeff = log_p.add_(entropy[:, None]).mul_(g_h[:, None]).add_(g_lp)
        grad_logits = probs.mul_(coeff).neg_()
    else:  # −p · g_lp
        grad_logits = probs.mul_(g_lp).neg_()
    grad_logits.scatter_add_(-1, labels.unsqueeze(-1), g_lp)
    return grad_logits.div_(temperature) if temperature != 1.0 else grad_logits


class _LinearLogProbs(torch.autograd.Function):
    """Chunked LM head + log-softmax + gather (+ entropy) with a hand-written backward.

    Forward, per chunk of positions, with z = (h Wᵀ + b) / T and p = softmax(z) (statistics in fp32):
        log p(y) = z_y − logsumexp(z)           H = logsumexp(z) − Σ_v p_v z_v
    Backward recomputes the chunk's logits (only h, W, the labels and two (N,) vectors are saved) and uses
        ∂log p(y)/∂z = onehot(y) − p            ∂H/∂z = −p ⊙ (log p + H)
    so no (N, V) tensor outlives its chunk. With `fused` (CUDA + Triton) each direction is one Triton pass over
    the chunk's logits in the compute dtype (see `kernels/triton_lm_head.py`); otherwise a handful of in-place
    torch passes over an fp32 copy, which is the reference the kernels are tested against.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, compute_entropy, chunk_size, fused):
        stats = []
        for start in range(0, max(hidden.shape[0], 1), chunk_size):  # one (empty) chunk when N = 0
            rows = slice(start, start + chunk_size)
            stats.append(_chunk_stats(hidden[rows], weight, bias, labels[rows], temperature, compute_entropy, fused))
        log_probs, log_normalizers, entropy = (torch.cat(parts) for parts in zip(*stats, strict=True))
        ctx.save_for_backward(hidden, weight, bias, labels, log_normalizers, entropy)
        ctx.temperature, ctx.compute_entropy = temperature, compute_entropy
        ctx.chunk_size, ctx.fused = chunk_size, fused
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, bias, labels, log_normalizers, entropy = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        needs_bias_grad = bias is not None and ctx.needs_input_grad[2]
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if needs_bias_grad else None
        use_entropy = ctx.compute_entropy and grad_entropy is not None
        grad_log_probs = grad_log_probs.float()
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            grad_logits = _chunk_grad_logits(
                hidden[rows],
                weight,
                bias,
                labels[rows],
                log_normalizers[rows],
                entropy[rows],
                grad_log_probs[rows],
                grad_entropy[rows].float() if use_entropy else None,
                ctx.temperature,
                ctx.fused,
            )
            if grad_bias is not None:
                grad_bias += grad_logits.sum(dim=0, dtype=torch.float32)
            grad_logits = grad_logits.to(weight.dtype)  # matmuls in the compute dtype (bf16 under FSDP2 on CUDA)
            if grad_hidden is not None:
                grad_hidden[rows] = (grad_logits @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += (grad_logits.t() @ hidden[rows].to(weight.dtype)).float()
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def log_probs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    chunk_size: int | None = None,
    bias: torch.Tensor | None = None,
    use_fused_kernels: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position log-probs (and entropy) of `labels` under `softmax((hidden Wᵀ + b) / temperature)`, chunked.

    hidden (N, H), weight (V, H), labels (N,) → two (N,) fp32 tensors (entropy is zeros unless asked for). At most
    one chunk of logits exists at a time, in forward and in backward. `use_fused_kernels` takes the Triton path
    where it applies (CUDA with Triton installed); `chunk_size=None` picks `default_chunk_size` for the path taken.
    """
    fused = use_fused_kernels and use_triton(hidden)
    if chunk_size is None:
        chunk_size = default_chunk_size(weight.shape[0], torch.result_type(hidden, weight), fused)
    labels = labels.contiguous()
    return _LinearLogProbs.apply(hidden, weight, bias, labels, temperature, compute_entropy, chunk_size, fused)


class PolicyModel(nn.Module):
    """Wraps a Hugging Face causal LM (or a peft model around one); forward gives response log-probs."""

    def __init__(
        self,
        lm: nn.Module,
        chunk_size: int | None = None,
        use_fused_kernels: bool = True,
        remove_padding: bool = False,
    ):
        """`chunk_size`: LM-head rows per chunk (None: `default_chunk_size`); `use_fused_kernels`: the Triton
        LM-head kernels on CUDA (the torch reference runs elsewhere either way); `remove_padding`: run the decoder
        on the real tokens only, packed (packing.py), and the LM head on the real response tokens only."""
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.use_fused_kernels = use_fused_kernels
        self.remove_padding = remove_padding
        if remove_padding:
            use_varlen_attention(lm)
        self._router_replay: RouterReplay | None = None  # hooks on a MoE model's routers, made on first use
        self.routing_record: torch.Tensor | None = None  # (B, T, Lm, k) of the last forward with record_routing

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
        packed: PackedRows | None = None,
        multi_modal_inputs: list[dict[str, torch.Tensor]] | None = None,
        routed_experts: torch.Tensor | None = None,
        record_routing: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) of `responses`, and entropies when asked. `packed`: the batch's `pack_rows(attention_mask,
        R)` made on the host and moved here (`PackedRows.to`), used with `remove_padding` (else packed from the mask
        here, which waits for the device). `multi_modal_inputs`: per-row processor outputs of a vision-language
        model (None or all empty: text only). A mixture-of-experts model replays `routed_experts` (B, T, Lm, k),
        and with `record_routing` keeps the experts it chose in `routing_record` (B, T, Lm, k) (router_replay.py)."""
        vision = batch_vision_inputs(multi_modal_inputs, input_ids.device)
        check_videos_supported(self.lm.config, vision)
        if self.remove_padding:
            if packed is None or packed.sources is None:
                packed = pack_rows(attention_mask, responses.shape[1])  # from the device mask: syncs
            self._set_routing(routed_experts, record_routing, packed.gather)
            packed_inputs = (input_ids, attention_mask, position_ids, responses)
            outputs = self._forward_packed(*packed_inputs, temperature, compute_entropy, packed, vision)
        else:
            self._set_routing(routed_experts, record_routing, lambda ids: ids.flatten(0, 1))
            outputs = self._forward_padded(
                input_ids, attention_mask, position_ids, responses, temperature, compute_entropy, vision
            )
        if record_routing:
            self.routing_record = self._routing_as_batch(attention_mask, packed if self.remove_padding else None)
        return outputs

    def _set_routing(self, routed_experts: torch.Tensor | None, record: bool, flatten) -> None:
        """Sets the routers for this forward (and its recomputation in backward): replay `routed_experts` flattened
        as the model flattens its tokens, record, or choose as usual."""
        if routed_experts is None and not record and self._router_replay is None:
            return
        if self._router_replay is None:
            self._router_replay = RouterReplay(self.lm)
        if routed_experts is not None:
            self._router_replay.replay(flatten(routed_experts))
        elif record:
            self._router_replay.record()
        else:
            self._router_replay.off()

    def _routing_as_batch(self, attention_mask: torch.Tensor, packed: PackedRows | None) -> torch.Tensor:
        """The experts the last forward chose, (B, T, Lm, k) in the compact dtype, no record at padding."""
        replay = self._router_replay
        recorded = replay.recorded(routing_dtype(replay.routers[0].num_experts))
        batch, length = attention_mask.shape
        full = recorded.new_full((batch * length, *recorded.shape[1:]), no_record_value(recorded.dtype))
        real = packed.indices if packed is not None else attention_mask.flatten().nonzero().squeeze(1)
        full[real] = recorded if packed is not None else recorded[real]
        return full.view(batch, length, *recorded.shape[1:])

    def _forward_padded(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        responses: torch.Tensor,
        temperature: float,
        compute_entropy: bool,
        vision: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` over the padded batch."""
        batch_size, response_length = responses.shape
        backbone = vision_language_backbone(self.lm) if vision or position_ids.dim() == 3 else self.lm.get_decoder()
        if position_ids.dim() == 3:  # (B, 3, T) M-RoPE rows -> the (3, B, T) the model reads
            position_ids = position_ids.transpose(0, 1)
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **vision
        ).last_hidden_state
        # The token at position t is predicted from the hidden state at t − 1.
        hidden = hidden[:, -response_length - 1 : -1].reshape(batch_size * response_length, -1)
        log_probs, entropy = self._head(hidden, responses.reshape(-1), temperature, compute_entropy)
        # reshape(...).clone(): FSDP2 warns about (and mishandles in-place ops on) root outputs that are views.
        log_probs = log_probs.reshape(batch_size, response_length).clone()
        return log_probs, (entropy.reshape(batch_size, response_length).clone() if compute_entropy else None)

    def _head(self, hidden: torch.Tensor, labels: torch.Tensor, temperature: float, compute_entropy: bool):
        head = self.lm.get_output_embeddings()
        return log_probs_from_hidden(
            hidden,
            head.weight,
            labels,
            temperature,
            compute_entropy,
            self.chunk_size,
            head.bias,
            self.use_fused_kernels,
        )

    def _forward_packed(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        responses: torch.Tensor,
        temperature: float,
        compute_entropy: bool,
        packed: PackedRows | None,
        vision: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` on the real tokens only; log-probs (and entropy) are 0 at padding response positions. A
        vision-language model runs its vision tower on the micro-batch's images first (`vision_encoder_outputs`)."""
        batch_size, response_length = responses.shape
        if is_vision_language(self.lm.config):
            backbone = vision_language_backbone(self.lm)
            encoded = {"mm_encoder_outputs": vision_encoder_outputs(backbone, vision)} if vision else {}
            hidden = forward_packed(backbone, input_ids, position_ids, packed, **encoded)  # (N, H)
        else:
            hidden = forward_packed(self.lm.get_decoder(), input_ids, position_ids, packed)
        rows, cols, sources = packed.response_rows, packed.response_cols, packed.sources
        log_probs, entropy = self._head(hidden[sources], responses[rows, cols], temperature, compute_entropy)
        full = log_probs.new_zeros(batch_size, response_length)
        log_probs = full.index_put((rows, cols), log_probs)
        if not compute_entropy:
            return log_probs, None
        return log_probs, full.index_put((rows, cols), entropy)
