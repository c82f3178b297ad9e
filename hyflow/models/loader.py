"""Load policies, critics and tokenizers from local Hugging Face folders. Nothing is ever downloaded.

    tokenizer = load_tokenizer(model_path, require_chat_template=True)
    policy = load_causal_lm(model_path, dtype=torch.float32, override_config={"attention_dropout": 0.0})
    critic = load_value_model(critic_path)                       # backbone + scalar value head
    reward_model = load_sequence_classifier(rm_path)              # backbone + its trained `score` head
    skeleton = load_causal_lm(model_path, empty_weights=True)     # parameters on `meta`, buffers real
    moe = load_causal_lm(moe_path, experts_implementation="grouped_mm")   # MoE: how transformers runs the experts

`empty_weights=True` builds the same module from the folder's config with every parameter on the `meta` device
(nothing allocated, nothing read) and every buffer real, computed by the module's own `__init__` as
`from_pretrained` computes it (rotary `inv_freq`); `hyflow.workers.lean_load` fills the parameters after FSDP2 has
sharded them, each rank only its own shards.

A mixture-of-experts model runs its experts with transformers' `experts_implementation`: hyflow asks for
`grouped_mm` (one grouped GEMM per projection over all experts, on CPU and CUDA; torch >= 2.9) unless the config
says otherwise, and a model that cannot is an error rather than a silent fall back to the per-expert Python loop
(`eager`). Dense models ignore the setting.

Every path is checked first: one that is not a local folder holding a `config.json` is a `ValueError` that names
the key it came from and says that hyflow does not download.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import transformers
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerBase,
)

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


def is_mixture_of_experts(config: transformers.PretrainedConfig) -> bool:
    """Whether the config describes routed experts (Qwen-MoE's `num_experts`, Mixtral's `num_local_experts`)."""
    text_config = getattr(config, "text_config", None) or config
    return bool(getattr(text_config, "num_experts", None) or getattr(text_config, "num_local_experts", None))


def experts_kwargs(config: transformers.PretrainedConfig, experts_implementation: str | None) -> dict[str, str]:
    """`{"experts_implementation": ...}` for `from_pretrained` / `from_config` of a MoE model (nothing for a dense
    model or None: transformers' own choice)."""
    if experts_implementation is None or not is_mixture_of_experts(config):
        return {}
    return {"experts_implementation": experts_implementation}


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers inside the block is moved to the `meta` device as it is registered
    (its initialisation then runs on meta: no memory, no random draws); buffers are created as usual."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = type(param)(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _build(
    path: str, config: transformers.PretrainedConfig, empty_weights: bool, model_class: type, **kwargs: Any
) -> transformers.PreTrainedModel:
    """`model_class.from_pretrained(path)`, or with `empty_weights` the same module from `config` with its
    parameters on meta, in eval mode and with the folder's generation config, as `from_pretrained` leaves it."""
    if not empty_weights:
        return model_class.from_pretrained(path, config=config, **kwargs)
    with parameters_on_meta():
        model = model_class.from_config(config, **kwargs)
    if model.can_generate() and os.path.isfile(os.path.join(path, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.eval()


def load_causal_lm(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    key: str = "actor_rollout_ref.model.path",
    empty_weights: bool = False,
    experts_implementation: str | None = "grouped_mm",
) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_pretrained` on a checked local folder, in `dtype`, with config overrides; a
    vision-language folder (its config has a `vision_config`) loads with `AutoModelForImageTextToText`.
    `empty_weights`: parameters on meta, nothing read (see the module docstring). `experts_implementation`: how a
    mixture-of-experts model computes its experts (`grouped_mm`, `batched_mm` or `eager`; None: transformers'
    default); dense models ignore it."""
    path = check_local_model_folder(path, key)
    config = load_model_config(path, override_config, trust_remote_code)
    kwargs: dict[str, Any] = {DTYPE_KWARG: dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    kwargs.update(experts_kwargs(config, experts_implementation))
    return _build(path, config, empty_weights, auto_model_class(config), **kwargs)


def load_sequence_classifier(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    key: str = "reward_model.model.path",
    empty_weights: bool = False,
) -> transformers.PreTrainedModel:
    """A reward model: `AutoModelForSequenceClassification.from_pretrained` on a checked local folder, in `dtype`
    (the backbone under `model.`, the `score` head of num_labels × hidden). A weight the folder lacks (the head of
    a causal LM's folder) is an error: `from_pretrained` would start it at random. `empty_weights`: every
    parameter on meta, the head's too (see the module docstring)."""
    path = check_local_model_folder(path, key)
    config = load_model_config(path, trust_remote_code=trust_remote_code)
    kwargs: dict[str, Any] = {DTYPE_KWARG: dtype, "trust_remote_code": trust_remote_code}
    if empty_weights:
        return _build(path, config, True, AutoModelForSequenceClassification, **kwargs)
    model, info = AutoModelForSequenceClassification.from_pretrained(
        path, config=config, output_loading_info=True, **kwargs
    )
    if info["missing_keys"]:
        raise ValueError(
            f"{key}={path!r} has no weights for {sorted(info['missing_keys'])[:3]}, so they would start at random "
            "and the scores would mean nothing; point it at a trained sequence-classification checkpoint (a causal "
            "LM's folder has no score head)."
        )
    return model


def load_value_model(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    key: str = "critic.model.path",
    empty_weights: bool = False,
) -> ValueModel:
    """A critic: the causal LM's backbone plus a scalar value head (restored if the folder has one, else zero).
    `empty_weights`: the backbone's parameters on meta (the small head is real, as above)."""
    lm = load_causal_lm(path, dtype, override_config, trust_remote_code, key=key, empty_weights=empty_weights)
    return value_model_of(lm, dtype, path)


def value_model_of(lm: transformers.PreTrainedModel, dtype: torch.dtype, path: str) -> ValueModel:
    """The critic on `lm`'s backbone (its LM head dropped), in `dtype`, with the value head saved in `path`
    (zero without one)."""
    model = ValueModel(*value_backbone(lm))
    model.to(dtype)
    model.load_value_head_if_present(path)
    return model
