"""The critic model: a decoder backbone (a causal LM without its LM head) plus a scalar value head.

    values = ValueModel(backbone, hidden_size)(input_ids, attention_mask, position_ids)     # (B, T) float32
    model.enable_remove_padding()     # the backbone runs on the real tokens only, packed (packing.py)

The head is a `Linear(hidden_size, 1)`, zero-initialised so a fresh critic predicts 0 everywhere. It is stored
next to the backbone weights as `value_head.safetensors` (`weight`, `bias`) so `load_value_model` can restore it.
"""

from __future__ import annotations

import logging
import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from hyflow.models.multimodal import batch_vision_inputs, vision_encoder_outputs
from hyflow.models.packing import PackedRows, forward_packed, pack_rows, use_varlen_attention

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """Backbone + `Linear(hidden_size, 1)`; `forward` returns one value per position, in float32."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        self.remove_padding = False

    def enable_remove_padding(self) -> None:
        """Run the backbone on the real tokens only, packed with varlen attention; values at padding are 0."""
        use_varlen_attention(self.backbone)
        self.remove_padding = True

    @property
    def config(self):
        return self.backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        packed: PackedRows | None = None,
        multi_modal_inputs: list[dict[str, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Values (B, T). `packed`: the batch's `pack_rows(attention_mask)` made on the host and moved here, used
        with remove_padding (else packed from the mask here, which waits for the device). A vision-language
        backbone also takes the rows' `multi_modal_inputs` and (B, 3, T) M-RoPE position ids."""
        vision = batch_vision_inputs(multi_modal_inputs, input_ids.device)
        if self.remove_padding:
            packed = packed if packed is not None else pack_rows(attention_mask)
            encoded = {"mm_encoder_outputs": vision_encoder_outputs(self.backbone, vision)} if vision else {}
            hidden = forward_packed(self.backbone, input_ids, position_ids, packed, **encoded)
            values = self.value_head(hidden).squeeze(-1)
            return (
                values.float()
                .new_zeros(input_ids.numel())
                .index_put((packed.indices,), values.float())
                .view(input_ids.shape)
            )
        if position_ids is not None and position_ids.dim() == 3:  # (B, 3, T) M-RoPE rows -> (3, B, T)
            position_ids = position_ids.transpose(0, 1)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **vision
        ).last_hidden_state
        # .clone(): FSDP2 mishandles in-place ops on root outputs that are views (and warns about them).
        return self.value_head(hidden).squeeze(-1).float().clone()

    def value_head_state(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().cpu().contiguous() for name, tensor in self.value_head.state_dict().items()}

    def load_value_head_if_present(self, path: str) -> bool:
        """Load `value_head.safetensors` from `path` if it exists; return whether it did."""
        file = os.path.join(path, VALUE_HEAD_FILE)
        if not os.path.isfile(file):
            logger.info("no %s in %s: the value head starts at zero", VALUE_HEAD_FILE, path)
            return False
        state = load_file(file)
        self.value_head.load_state_dict({k: v.to(self.value_head.weight.dtype) for k, v in state.items()})
        return True


def save_value_head(state: dict[str, torch.Tensor], path: str) -> None:
    """Write a value head's `weight` / `bias` to `path/value_head.safetensors`."""
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(path, VALUE_HEAD_FILE))
