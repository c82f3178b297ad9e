#!/usr/bin/env bash
# Every GPU check and benchmark of the repo in one go, each beside its baseline, with a time limit per step:
#   bash benchmarks/run_gpu_suite.sh [results-folder] [parts]   # default: $OUT, else ./gpu_results; all parts
# Parts (comma-separated): tests, grpo, actor, rollout, vlm (the Qwen2.5-VL-3B shape: generation, a GRPO step),
# moe (the Qwen3-30B-A3B shape cut to 16 layers: generation beside transformers.generate, the fused MoE kernels;
# a small MoE's train-inference mismatch with routing replay off and on);
# and peers (not by default: vLLM beside the engine at the 0.5B and 7B shapes, the 7B GRPO step beside TRL+vLLM;
# needs vLLM 0.25.0 on PYTHONPATH, see benchmarks/README.md); nemo (not by default: the GRPO step at NeMo-RL's
# Llama-3.1-8B shape per GPU, the one-GPU anchor of issue #23, ~4 minutes; NEMO_RL_SHAPE in suite_step.sh).
# DRY_RUN=1 prints every command instead of running it.
# Logs land in the folder (one file per step) and the summary lines on stdout. About 11 minutes on one H200
# before the batch-scaling step and the 1024-row / 7B kernel shapes were added (~1.5 minutes more, by their parts).
# TRL's side of grpo_step.py needs trl (and datasets, dill, multiprocess); without it that side is skipped.
set -uo pipefail
source "$(dirname "$0")/suite_step.sh"
results_and_parts "${1:-}" "${2:-}" tests,grpo,actor,rollout,vlm,moe

if [[ $parts == *,tests,* ]]; then
    step gpu_tests 180 "passed|failed|FAILED|skipped in" \
        python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py tests/engine/test_triton_rope.py \
        tests/engine/test_triton_step.py tests/engine/test_async_scheduling.py tests/engine/test_triton_moe.py \
        tests/models/test_fused_gpu.py \
        tests/models/test_packing_gpu.py
fi
if [[ $parts == *,grpo,* ]]; then
    step grpo_step 250 "steps 2-4|generated|hyflow |/ hyflow|skipped" python3 benchmarks/grpo_step.py
    step grpo_keep_kv 100 "steps 2-4|hyflow " python3 benchmarks/grpo_step.py --only hyflow --keep-kv-cache
fi
if [[ $parts == *,actor,* ]]; then
    step actor_mb8 90 "ms/step|ratio" python3 benchmarks/actor_update.py
    step actor_mb16 90 "ms/step|ratio" python3 benchmarks/actor_update.py --micro-batch-size 16
    step actor_ragged 90 "ms/step|ratio" python3 benchmarks/actor_update.py --ragged
fi
if [[ $parts == *,rollout,* ]]; then
    step rollout 200 "^case|prefill steps" python3 benchmarks/rollout_throughput.py --cases a,b,c --trace
    step rollout_one_window_at_a_time 90 "^case|prefill steps" \
        python3 benchmarks/rollout_throughput.py --no-hf --cases a,b,c --trace --no-async-scheduling
    step rollout_batch_scaling 90 "^case|prefill steps" \
        python3 benchmarks/rollout_throughput.py --no-hf --no-vllm --cases s256,s1024 --trace
    step decode_kernels 200 "^decode|^sampler|^silu|current" python3 benchmarks/decode_kernels.py --shapes c,a,s1024,7b
fi
if [[ $parts == *,vlm,* ]]; then
    step vlm_generate 240 "^prompt|engine|transformers" python3 benchmarks/vlm_generate.py
    step vlm_grpo_step 400 "steps 2-4|generated|hyflow |peak" python3 benchmarks/vlm_grpo_step.py
fi
if [[ $parts == *,moe,* ]]; then
    step moe_generate 200 "^case|skipped" python3 benchmarks/rollout_throughput.py --shape 30b-a3b --num-layers 16 \
        --cases a --trace
    step moe_generate_grpo 200 "^case|skipped" python3 benchmarks/rollout_throughput.py --shape 30b-a3b \
        --num-layers 16 --cases b --no-hf --trace
    step moe_kernels 200 "^T=|^device" python3 benchmarks/moe_kernels.py
    step moe_mismatch 300 "^router_replay|^device" python3 benchmarks/moe_mismatch.py
fi
if [[ $parts == *,peers,* ]]; then
    step rollout_peers_05b 330 "^case|skipped" python3 benchmarks/rollout_throughput.py --cases a,b,c,long --no-hf
    step rollout_peers_7b 240 "^case|skipped" python3 benchmarks/rollout_throughput.py --shape 7b --cases a,d --no-hf
    step grpo_7b 330 "steps 2-4|generated|hyflow |/ hyflow|skipped" python3 benchmarks/grpo_step.py --shape 7b \
        --master-dtype bf16 --micro-batch-size 8 --only hyflow,trl-vllm
fi
if [[ $parts == *,nemo,* ]]; then
    step grpo_7b_nemo_rl_1gpu 420 "GRPO step on|steps 2-|tok/s|hyflow |Error" \
        python3 benchmarks/grpo_step.py --only hyflow "${NEMO_RL_SHAPE[@]}" --prompts 4
fi
