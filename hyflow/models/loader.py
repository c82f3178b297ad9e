"""Load policies, critics and tokenizers from local Hugging Face folders. Nothing is ever downloaded.

    tokenizer = load_tokenizer(model_path, require_chat_template=True)
    policy = load_causal_lm(model_path, dtype=torch.float32, override_config={"attention_dropout": 0.0})
    critic = load_value_model(critic_path)                       # backbone + scalar value head

Every path is checked first: one that is not a local folder holding a `config.json` is a `ValueError` that names
the key it came from and says that hyflow does not download.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from hyflow.models.folders import check_local_model_folder
from hyflow.models.multimodal import auto_model_class, value_backbone
from hyflow.models.value_head import ValueModel

logger = logging.getLogger(__name__)

# transformers 5 renamed `torch_dtype` to `dtype` in from_pretrained / from_config.
DTYPE_KWARG = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


def load_tokenizer(
    path: str | os.PathLike,
    require_chat_template: bool = False,
    trust_remote_code: bool = False,
    key: str = "actor_rollout_ref.model.tokenizer_path",
) -> PreTrainedTokenizerBase:
    """Load the tokenizer from a local folder; a missing pad token falls back to eos (as most recipes do)."""
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isdir(path):
        raise ValueError(
            f"{key}={path!r} is not a local folder; hyflow downloads nothing. Point it at a folder with the "
            "tokenizer files (tokenizer.json / tokenizer_config.json), usually the model folder itself."
        )
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if require_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{key}={path!r}: the tokenizer has no chat template, but prompts are chat messages. Use an instruct "
            "model's tokenizer, add `chat_template` to its tokenizer_config.json, or pass raw text prompts."
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("tokenizer at %s has no pad token; using eos %r as pad", path, tokenizer.eos_token)
    return tokenizer


def load_model_config(
    path: str, override_config: dict[str, Any] | None = None, trust_remote_code: bool = False
) -> transformers.PretrainedConfig:
    """The model's config with `override_config` applied (keys must be attributes of the config)."""
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for name, value in (override_config or {}).items():
        if not hasattr(config, name):
            raise ValueError(
                f"override_config.{name}={value!r}: {type(config).__name__} has no attribute {name!r}; "
                "only existing config attributes can be overridden (see the model's config.json)."
            )
        setattr(config, name, value)
    return config


def load_causal_lm(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    key: str = "actor_rollout_ref.model.path",
) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_pretrained` on a checked local folder, in `dtype`, with config overrides; a
    vision-language folder (its config has a `vision_config`) loads with `AutoModelForImageTextToText`."""
    path = check_local_model_folder(path, key)
    config = load_model_config(path, override_config, trust_remote_code)
    kwargs: dict[str, Any] = {DTYPE_KWARG: dtype, "config": config, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return auto_model_class(config).from_pretrained(path, **kwargs)


def load_value_model(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    key: str = "critic.model.path",
) -> ValueModel:
    """A critic: the causal LM's backbone plus a scalar value head (restored if the folder has one, else zero)."""
    path = check_local_model_folder(path, key)
    config = load_model_config(path, override_config, trust_remote_code)
    lm = auto_model_class(config).from_pretrained(
        path, config=config, trust_remote_code=trust_remote_code, **{DTYPE_KWARG: dtype}
    )
    model = ValueModel(*value_backbone(lm))
    model.to(dtype)
    model.load_value_head_if_present(path)
    return model
