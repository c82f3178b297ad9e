"""`hyflow merge`: turn a training checkpoint into a plain Hugging Face folder that `from_pretrained` loads.

    hyflow merge ckpt/global_step_100/actor  out/policy-step100      # LoRA adapters are folded into the weights
    hyflow merge ckpt/global_step_100/critic out/critic-step100      # backbone + value_head.safetensors

The checkpoint's `huggingface/` folder holds the model config and tokenizer; the model is rebuilt from them (with
the same LoRA wrapping when the checkpoint says so), the sharded weights are loaded with
`torch.distributed.checkpoint` in this one process, adapters are merged, and the result is written to a temporary
folder that is renamed to OUTPUT once complete. Runs on CPU; needs memory for one full copy of the model.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from transformers import AutoConfig, AutoTokenizer

from hyflow.models.lora import apply_lora
from hyflow.models.multimodal import auto_model_class, value_backbone
from hyflow.models.policy import PolicyModel
from hyflow.models.processor import copy_processor_files
from hyflow.models.value_head import ValueModel, save_value_head
from hyflow.workers.checkpoint import MARKER_FILE, read_checkpoint_info

logger = logging.getLogger(__name__)


def resolve_checkpoint(path: str) -> str:
    """Accept a role folder (`.../actor`) or a step folder holding exactly one of `actor/`, `critic/`."""
    if os.path.isfile(os.path.join(path, MARKER_FILE)):
        return path
    roles = [r for r in ("actor", "critic") if os.path.isfile(os.path.join(path, r, MARKER_FILE))]
    if len(roles) == 1:
        return os.path.join(path, roles[0])
    if roles:
        raise ValueError(f"{path!r} holds checkpoints of {roles}; pass one of them, e.g. {path}/actor.")
    read_checkpoint_info(path)  # raises the clear "does not exist" / "incomplete" error
    return path


def rebuild_model(hf_dir: str, info: dict) -> nn.Module:
    """The module the checkpoint was saved from, with fresh weights, built from the saved config."""
    config = AutoConfig.from_pretrained(hf_dir)
    lm = auto_model_class(config).from_config(config)
    if info.get("kind") == "critic":
        return ValueModel(*value_backbone(lm))
    lora = info.get("lora")
    if lora:
        lm = apply_lora(lm, lora["rank"], lora["alpha"], lora["target_modules"], lora["exclude_modules"])
    return PolicyModel(lm)


def load_sharded_weights(model: nn.Module, checkpoint: str) -> None:
    state = get_model_state_dict(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load({"model": state}, checkpoint_id=os.path.join(checkpoint, "dcp"))
    set_model_state_dict(model, state)


def merge_checkpoint(checkpoint: str, output: str) -> str:
    """Write the checkpoint's model as a Hugging Face folder at `output` (which must not exist yet)."""
    if os.path.exists(output):
        raise ValueError(f"output {output!r} already exists; pass a new folder (hyflow merge never overwrites).")
    checkpoint = resolve_checkpoint(os.path.abspath(checkpoint))
    info = read_checkpoint_info(checkpoint)
    if "model" not in info.get("contents", []):
        raise ValueError(f"checkpoint {checkpoint!r} was saved without 'model' in checkpoint.save_contents.")
    hf_dir = os.path.join(checkpoint, "huggingface")
    model = rebuild_model(hf_dir, info)
    load_sharded_weights(model, checkpoint)
    tmp = os.path.abspath(output) + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(model, ValueModel):
        model.backbone.save_pretrained(tmp)
        save_value_head(model.value_head_state(), tmp)
    else:
        lm = model.lm.merge_and_unload() if info.get("lora") else model.lm
        lm.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(hf_dir).save_pretrained(tmp)
    copy_processor_files(hf_dir, tmp)
    generation_config = os.path.join(hf_dir, "generation_config.json")
    if os.path.isfile(generation_config):
        shutil.copy(generation_config, tmp)
    os.rename(tmp, output)
    logger.info("merged %s (%s) into %s", checkpoint, info.get("kind"), output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hyflow merge",
        description="Turn a hyflow checkpoint (…/global_step_N/actor or …/critic) into a Hugging Face folder; LoRA "
        "adapters are folded into the weights.",
    )
    parser.add_argument("checkpoint", help="checkpoint folder written by save_checkpoint (…/actor or …/critic)")
    parser.add_argument("output", help="new folder for the Hugging Face model (must not exist)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with torch.no_grad():
        merge_checkpoint(args.checkpoint, args.output)
    return 0
