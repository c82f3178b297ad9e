"""The model shapes the benchmarks build with random weights: sizes of public models, nothing downloaded."""

from __future__ import annotations

SHAPES: dict[str, dict[str, int | float | bool]] = {
    "tiny": dict(  # a CPU smoke test
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    ),
    "0.5b": dict(  # Qwen2-0.5B, 494M parameters
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, tie_word_embeddings=True,
    ),
    "1.5b": dict(  # Qwen2.5-1.5B, 1.5B parameters
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0,
    ),
    "7b": dict(  # Qwen2.5-7B, 7.6B parameters
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, tie_word_embeddings=False, rope_theta=1000000.0,
    ),
    "32b": dict(  # Qwen2.5-32B, 32.8B parameters (TP 2, 4 or 8: 40 query and 8 KV heads)
        vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
        num_key_value_heads=8, tie_word_embeddings=False, rope_theta=1000000.0,
    ),
}  # fmt: skip

# Mixture-of-experts shapes (Qwen3-MoE configs): the field's default RL model of 2026. `--num-layers` in the
# benchmarks that take it cuts the depth so that two copies (the transformers model and the engine's) fit one GPU;
# the per-layer work, and so tokens/s per layer, is unchanged.
MOE_SHAPES: dict[str, dict[str, int | float | bool]] = {
    "tiny-moe": dict(  # a CPU smoke test
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, tie_word_embeddings=True,
    ),
    "30b-a3b": dict(  # Qwen3-30B-A3B: 30.5B parameters, 3.3B active (128 experts, 8 per token)
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, tie_word_embeddings=False, rope_theta=1000000.0,
    ),
}  # fmt: skip
