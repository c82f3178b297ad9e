"""The `transformers.generate` fallback rollout (`rollout.name=hf`), for architectures the engine does not implement.

Same surface as the engine rollout (`generate_sequences`, `generate`, `load_weights`, `sleep`, `wake`), slower:
no continuous batching and no paged cache. Log-probs come from the processed scores `generate` samples from
(after temperature / top-k / top-p), like the engine's.

Vision-language models (Qwen2-VL & co.) generate from the prompts' `multi_modal_inputs` (one dict of processor
outputs per row, concatenated in row order) with the prompts' image pad tokens already expanded by the dataset;
transformers computes the M-RoPE positions from `mm_token_type_ids`, as the dataset did for training. Their
vision markup tokens (image / video pads, vision start / end) are never sampled: a pad in a response would be taken
for an image slot by the training forward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from hyflow import fields as F
from hyflow.engine.config import SamplingParams
from hyflow.engine.sequence import CompletionOutput
from hyflow.models.multimodal import batch_vision_inputs, mm_token_type_ids
from hyflow.protocol import DataProto
from hyflow.rollout.batch import pack_responses


def _generate_kwargs(params: SamplingParams, eos_ids: list[int], pad_id: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        max_new_tokens=params.max_tokens,
        pad_token_id=pad_id,
        output_scores=True,
        return_dict_in_generate=True,
        eos_token_id=None if params.ignore_eos else eos_ids,
    )
    if params.greedy:
        return {**kwargs, "do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    top_k = params.top_k if params.top_k > 0 else 0
    return {**kwargs, "do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": top_k}


class HFRollout:
    def __init__(self, model: nn.Module, tokenizer: Any, response_length: int, sampling_for: Any = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.response_length = response_length
        self.sampling_for = sampling_for  # DataProto.meta_info -> SamplingParams (worker_rollout.py)
        self.policy_version = 0  # of the weights loaded last (load_weights)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = eos if eos is not None else getattr(model.config, "eos_token_id", None)
        self.eos_token_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        tokenizer_eos = tokenizer.eos_token_id if tokenizer is not None else None
        if tokenizer_eos is not None and tokenizer_eos not in self.eos_token_ids:
            self.eos_token_ids.append(tokenizer_eos)
        pad = tokenizer.pad_token_id if tokenizer is not None else getattr(model.config, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else (self.eos_token_ids or [0])[0]
        vision_tokens = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        self.suppressed_ids = [i for i in (getattr(model.config, n, None) for n in vision_tokens) if i is not None]

    def _vision_kwargs(self, input_ids: torch.Tensor, rows: Any, device: torch.device) -> dict[str, torch.Tensor]:
        """`generate`'s vision inputs for the batch: pixel_values, image_grid_thw (pixel_values_videos,
        video_grid_thw) and the token types (1 = image, 2 = video)."""
        vision = batch_vision_inputs(list(rows) if rows is not None else None, device)
        if not vision:
            return {}
        image_token_id = getattr(self.model.config, "image_token_id", None)
        if image_token_id is None:
            raise ValueError(
                f"the prompts carry images, but the rollout model {type(self.model).__name__} has no "
                "image_token_id in its config; point model.path at a vision-language model."
            )
        return {**vision, "mm_token_type_ids": mm_token_type_ids(input_ids, self.model.config).to(device)}

    @torch.no_grad()
    def _generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        multi_modal_inputs: Any = None,
    ) -> tuple[list[list[int]], list[list[float]], list[str]]:
        device = next(self.model.parameters()).device
        if params.seed is not None:
            torch.manual_seed(params.seed)
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            **self._vision_kwargs(input_ids, multi_modal_inputs, device),
            **_generate_kwargs(params, self.eos_token_ids, self.pad_token_id),
            suppress_tokens=self.suppressed_ids or None,
        )
        new_tokens = out.sequences[:, input_ids.shape[1] :].cpu()
        log_probs = torch.stack([s.float().log_softmax(-1) for s in out.scores], dim=1).cpu()  # (B, R, V)
        token_log_probs = log_probs.gather(2, new_tokens.unsqueeze(2)).squeeze(2)
        responses, lps, reasons = [], [], []
        for row, row_lps in zip(new_tokens.tolist(), token_log_probs.tolist()):
            end = next((i + 1 for i, t in enumerate(row) if t in self.eos_token_ids and not params.ignore_eos), None)
            responses.append(row[:end] if end else row)
            lps.append(row_lps[: len(responses[-1])])
            reasons.append("stop" if end else "length")
        return responses, lps, reasons

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        params = self.sampling_for(prompts.meta_info)
        batch, images = prompts.batch, prompts.non_tensor_batch.get(F.MULTI_MODAL_INPUTS)
        responses, lps, reasons = self._generate(batch[F.INPUT_IDS], batch[F.ATTENTION_MASK], params, images)
        versions = [[self.policy_version] * len(tokens) for tokens in responses]  # one call, one set of weights
        return pack_responses(prompts, responses, lps, reasons, self.response_length, self.pad_token_id, versions)

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        multi_modal_inputs: dict[str, torch.Tensor] | None = None,
    ) -> CompletionOutput:
        """One prompt through `transformers.generate`, in a worker thread. `multi_modal_inputs`: the processor
        outputs of the images / videos whose pad tokens `prompt_token_ids` hold (an agent loop's conversation)."""
        ids = torch.tensor([prompt_token_ids])
        rows = [multi_modal_inputs] if multi_modal_inputs else None
        responses, lps, reasons = await asyncio.to_thread(self._generate, ids, torch.ones_like(ids), params, rows)
        return CompletionOutput(0, responses[0], lps[0], reasons[0])

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int | None = None) -> int:
        """Copies HF-named tensors into the model; `policy_version` (default: one more) is what its tokens record."""
        self.policy_version = self.policy_version + 1 if policy_version is None else policy_version
        params = dict(self.model.named_parameters(remove_duplicate=False))
        count = 0
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"weight {name!r} is not a parameter of the rollout model {type(self.model).__name__}")
            params[name].data.copy_(tensor)
            count += 1
        return count

    def sleep(self) -> None:
        """Nothing to free: `generate` keeps no cache between calls."""

    def wake(self) -> None:
        """Nothing to restore (see sleep)."""

    @property
    def cuda_graph_captures(self) -> int:
        """CUDA graphs captured so far: none (`generate` runs eagerly)."""
        return 0
