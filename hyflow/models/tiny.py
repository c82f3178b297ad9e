"""The tiny-model kit: a small tokenizer and a small decoder model, saved as a normal Hugging Face folder.

Tests and `hyflow demo` use it so that nothing is downloaded:

    from hyflow.models.tiny import build_tiny_model, build_tiny_tokenizer
    path = build_tiny_model("/tmp/tiny-qwen2", arch="qwen2")          # model + tokenizer, random init (seeded)
    path = build_tiny_model("/tmp/tiny-moe", arch="qwen3_moe")        # mixture of experts: 4 experts, top-2
    model = AutoModelForCausalLM.from_pretrained(path)                   # works with HF_HUB_OFFLINE=1

The tokenizer is a byte-level BPE trained in well under a second on a small built-in text (digits are always
single tokens, so arithmetic stays learnable), with Qwen-style special tokens (`<|im_start|>`, `<|im_end|>`,
`<|endoftext|>` as pad) and a ChatML chat template that renders `tools` and Hermes `<tool_call>` blocks.
`build_tiny_tokenizer(thinking=True)` / `build_tiny_model(path, thinking_template=True)` give it a thinking-model
template instead (Qwen3-style: earlier turns' `<think>` blocks are dropped on render; THINKING_CHAT_TEMPLATE).
"""

from __future__ import annotations

import json
import logging
import os
import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
# Tool markup: plain (non-special) added tokens, so they survive `skip_special_tokens=True` like Qwen's.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

SUPPORTED_ARCHS = ("qwen2", "llama", "qwen3", "mistral", "qwen3_moe", "qwen2_moe", "mixtral")
# Mixture-of-experts archs: 4 experts, 2 per token, each expert half the dense MLP's width (Qwen2-MoE's shared
# expert as wide as it); Mixtral's experts are `intermediate_size` wide.
MOE_EXPERTS, MOE_TOP_K = 4, 2


def _moe_sizes(arch: str, intermediate_size: int) -> dict[str, int]:
    if arch == "mixtral":
        return {"num_local_experts": MOE_EXPERTS, "num_experts_per_tok": MOE_TOP_K}
    if arch not in ("qwen3_moe", "qwen2_moe"):
        return {}
    sizes = {
        "num_experts": MOE_EXPERTS,
        "num_experts_per_tok": MOE_TOP_K,
        "moe_intermediate_size": max(intermediate_size // 2, 1),
        "norm_topk_prob": True,
    }
    if arch == "qwen2_moe":
        sizes["shared_expert_intermediate_size"] = intermediate_size
    return sizes


# ChatML with Hermes-style tools, written for hyflow. `tools` go into the system turn as JSON lines; assistant
# tool calls render as <tool_call>{json}</tool_call>; tool results go back in a user turn as <tool_response>.
# The @NAME@ slots are empty in CHAT_TEMPLATE and filled in THINKING_CHAT_TEMPLATE.
_TEMPLATE = (
    "@PREAMBLE@"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Function signatures are inside <tools></tools>:' }}"
    "{{- '\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return a JSON object with the function name and arguments inside "
    '<tool_call></tool_call>:\\n<tool_call>\\n{\\"name\\": <name>, \\"arguments\\": <args>}\\n</tool_call>'
    "<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- if not loop.first %}{{- '<|im_start|>system\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'user' %}"
    "{{- '<|im_start|>user\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- set content = message['content'] %}"
    "@ASSISTANT_CONTENT@"
    "{%- if content %}{{- content }}{%- endif %}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}@GENERATION_PROMPT@{%- endif %}"
)


_SLOTS = ("@PREAMBLE@", "@ASSISTANT_CONTENT@", "@GENERATION_PROMPT@")


def _filled_template(slots: dict[str, str]) -> str:
    """_TEMPLATE with each @NAME@ slot replaced by its text in `slots` (empty when not given)."""
    template = _TEMPLATE
    for slot in _SLOTS:
        template = template.replace(slot, slots.get(slot, ""))
    return template


CHAT_TEMPLATE = _filled_template({})

# The same, thinking-model style (as Qwen3's): an assistant turn before the last user message renders without its
# reasoning (what precedes `</think>` is dropped), so re-rendering a multi-turn conversation does not give back the
# tokens the model sampled; a turn after it keeps its content, and `reasoning_content` renders as a <think> block.
# The generation prompt opens the assistant turn; with `enable_thinking=False` it also writes an empty think block.
_THINKING_SLOTS = {
    "@PREAMBLE@": (
        "{%- set ns = namespace(last_user=-1) %}"
        "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
        "{%- endfor %}"
    ),
    "@ASSISTANT_CONTENT@": (
        "{%- if content is string and '</think>' in content and loop.index0 < ns.last_user %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
        "{%- elif message.get('reasoning_content') and loop.index0 > ns.last_user %}"
        "{%- set content = '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' + (content or '') %}"
        "{%- endif %}"
    ),
    "@GENERATION_PROMPT@": (
        "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    ),
}
THINKING_CHAT_TEMPLATE = _filled_template(_THINKING_SLOTS)


def _training_text() -> list[str]:
    """A small built-in corpus: digits, operators, letters, chat and tool markup, a little English."""
    lines = [
        string.ascii_letters,
        string.digits + " " + string.punctuation,
        "What is 12 + 34? Let's think step by step. 12 + 34 = 46. The answer is 46. #### 46",
        "Compute 7 * 8 - 5 / 2 = 53.5 and (3 + 4) ** 2 = 49. Answer: \\boxed{49}",
        "Using the numbers [3, 5, 7], create an equation that equals 22. <answer>3 * 5 + 7</answer>",
        "You are a helpful assistant. Please reason step by step, and put your final answer within \\boxed{}.",
        '{"name": "calculator", "arguments": {"expression": "2 + 2"}} {"type": "function", "function": {}}',
        "the quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.",
        "system user assistant tool tools function name arguments description parameters properties required",
        "question answer solution result number sum product difference equation search query retrieve document",
    ]
    return lines * 4


def build_tiny_tokenizer(vocab_size: int = 512, thinking: bool = False) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the built-in text and wrap it as a chat tokenizer (deterministic, ~0.1 s).
    `thinking=True`: with THINKING_CHAT_TEMPLATE (earlier turns' <think> blocks dropped on render), else ChatML."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=IM_END,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        padding_side="left",
        model_max_length=4096,
    )
    wrapped.add_tokens(TOOL_TOKENS)
    wrapped.chat_template = THINKING_CHAT_TEMPLATE if thinking else CHAT_TEMPLATE
    return wrapped


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: str | os.PathLike) -> None:
    """Save the tokenizer so that both transformers 4.x and 5.x load it (class named `PreTrainedTokenizerFast`)."""
    tokenizer.save_pretrained(path)
    config_file = os.path.join(path, "tokenizer_config.json")
    with open(config_file) as f:
        tokenizer_config = json.load(f)
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(config_file, "w") as f:
        json.dump(tokenizer_config, f, indent=2)


def _model_config(arch: str, vocab_size: int, tokenizer: PreTrainedTokenizerFast, **sizes: int):
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"build_tiny_model: arch={arch!r} is not supported; use one of {list(SUPPORTED_ARCHS)}.")
    hidden_size, num_heads = sizes["hidden_size"], sizes["num_attention_heads"]
    if hidden_size % num_heads or num_heads % sizes["num_key_value_heads"]:
        raise ValueError(
            f"build_tiny_model: hidden_size={hidden_size}, num_attention_heads={num_heads}, "
            f"num_key_value_heads={sizes['num_key_value_heads']}: heads must divide hidden_size and kv heads must "
            "divide heads; pick e.g. hidden_size=64, num_attention_heads=4, num_key_value_heads=2."
        )
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    return AutoConfig.for_model(
        arch,
        vocab_size=vocab_size,
        head_dim=hidden_size // num_heads,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        **_moe_sizes(arch, sizes["intermediate_size"]),
        **sizes,
    )


def build_tiny_model(
    path: str | os.PathLike,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerFast | None = None,
    thinking_template: bool = False,
) -> str:
    """Save a randomly initialised (seeded) decoder model and its tokenizer to `path`; return the path.

    The folder holds `config.json`, `model.safetensors`, `generation_config.json` and the tokenizer files, so
    `AutoModelForCausalLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)` load it offline.
    `thinking_template=True` builds the tokenizer with the thinking-model template (when `tokenizer` is not given).
    """
    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer(thinking=thinking_template)
    vocab_size = ((len(tokenizer) + 63) // 64) * 64  # padded like real checkpoints; extra rows are never sampled
    config = _model_config(
        arch,
        vocab_size,
        tokenizer,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
    )
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD)]
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    save_tokenizer(tokenizer, path)
    num_params = sum(p.numel() for p in model.parameters())
    logger.info("built tiny %s model (%d params, vocab %d) at %s", arch, num_params, vocab_size, path)
    return path


def peak_weights(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> torch.nn.Module:
    """Redraw every matrix of `model` from N(0, std²) (in place, seeded): a tiny random model's default init gives
    nearly flat next-token distributions, these weights give peaked ones, so greedy tokens are clear choices and
    log-probs depend visibly on the positions."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, std)
    return model
