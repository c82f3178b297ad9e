"""hyflow.models: the models the training engine trains, loaded from local Hugging Face folders.

- `loader.py`: `load_causal_lm`, `load_value_model`, `load_sequence_classifier` (the reward model),
  `load_tokenizer` (local folders only; clear errors otherwise; `empty_weights=True`: parameters on meta, for
  `hyflow.workers.lean_load`)
- `policy.py`: `PolicyModel`, a causal LM whose forward returns response log-probs via a chunked LM head
- `value_head.py`: `ValueModel`, backbone + scalar value head (the critic)
- `lora.py`: `apply_lora` (peft) and `merged_hf_weights` (adapters folded into plain weights)
- `moe_routers.py`: `RouterCapture`, forward hooks that record a mixture-of-experts model's router logits and experts
- `kernels/`: fused Triton kernels (LM-head log-probs, RMSNorm, SiLU-and-mul, rotary) and `apply_fused_kernels`
- `tiny.py`: `build_tiny_tokenizer`, `build_tiny_model`: a tiny model + tokenizer folder for tests and the demo
"""
