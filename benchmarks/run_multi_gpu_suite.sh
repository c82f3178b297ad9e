#!/usr/bin/env bash
# The multi-GPU checks and benchmarks (issues #10, #23) on a machine with N = 2, 4 or 8 GPUs, each beside its
# one-GPU counterpart of the same run:
#   bash benchmarks/run_multi_gpu_suite.sh [results-folder] [parts]   # default: $OUT, else ./gpu_results; all parts
# N is the number of visible GPUs (nvidia-smi -L; set GPUS=N to use fewer). Each part's steps together have at most
# 600 s of time limits (one 10-minute device call; tests/benchmarks/test_suite_commands.py checks it), so run one
# part, or a few short ones, per call. Parts (comma-separated; [limits of its steps]):
#   tests   — the NCCL tests (FSDP2 update on 2 GPUs == 1 GPU, engine TP=2 == TP=1), on GPUs 0 and 1 [300 s];
#   sync    — weight_sync.py at the 7B shape over N GPUs: engines of TP 1 (one per GPU) and of TP min(N, 4), each
#             beside the full-tensor sync (goal: 7B in at most 1 s) [600 s]; sync32b — on 8 GPUs the 32B shape with
#             TP 8 [420 s];
#   actor   — actor_update.py at the 1.5B shape on 1 GPU and on N [540 s]; actor7b — at 7B on 2 GPUs and on N (fp32
#             AdamW of 7B does not fit one GPU) [600 s] (tokens/s per GPU: goal >= 0.9x);
#   rollout — the generation engine at TP=1 and TP=2 (0.5B, cases a, b, c) [350 s];
#   grpo    — a GRPO step at 0.5B on 1 GPU (local backend) and on N Ray workers [390 s]; grpo7b1 — at 7B on 1 GPU
#             [420 s]; grpo7b — at 7B on N workers (one engine per GPU) [480 s]; grpo32b — on 8 GPUs the 32B shape
#             with TP 8 [600 s]. Each training rank reads only its 1/N rows of each tensor from the checkpoint into
#             its GPU shards (hyflow/workers/lean_load.py): host memory per rank for loading is one tensor's 1/N
#             rows, not the whole model;
#   nemo1   — the GRPO step at NeMo-RL's Llama-3.1-8B shape per GPU (NEMO_RL_SHAPE in suite_step.sh: 7B, 4 prompts
#             x 32, 128 -> 1,024 tokens, 4 optimizer steps, k3 KL to a reference) on 1 GPU: `total tok/s/GPU
#             (NeMo-RL)` against its 1,581 (on-policy, 16 H100s) [420 s]; nemo — the same on N Ray workers (4 x N
#             prompts: the same per GPU) [540 s];
#   async   — async_rl.py at the 0.5B shape on the N GPUs: colocated on all N, then split placement on N/2 training
#             + N/2 rollout GPUs (sync, one_step_off, async1), same prompts and seed, in one run: tokens/s per GPU
#             and each mode's ratio to colocated and to sync [540 s]; async7b — the same at the 7B shape (bf16
#             master weights, gradient checkpointing; colocated, sync, one_step_off) [590 s].
# `engines` names actor and rollout. The 8-GPU-only parts do nothing on fewer GPUs. nemo1, nemo, async and async7b
# have not run on a GPU yet: their limits are estimates. DRY_RUN=1 prints every step's name, limit and command
# instead of running it (no GPU needed).
# NVLink multicast stays off, as the machines that lend several GPUs ask.
set -uo pipefail
source "$(dirname "$0")/suite_step.sh"
results_and_parts "${1:-}" "${2:-}" \
    tests,sync,sync32b,actor,actor7b,rollout,grpo,grpo7b1,grpo7b,grpo32b,nemo1,nemo,async,async7b
[[ $parts == *,engines,* ]] && parts="$parts,actor,actor7b,rollout,"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
if (( gpus < 2 )); then
    echo "run_multi_gpu_suite.sh needs at least 2 GPUs; found $gpus (set GPUS=N to choose)" >&2
    exit 2
fi
tp=$(( gpus < 4 ? gpus : 4 ))  # the 7B shape's 28 heads split 2 or 4 ways, not 8
torchrun_n=(python3 -m torch.distributed.run --nproc-per-node "$gpus")  # an array: `timeout` runs no shell functions
echo "== $gpus GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

if [[ $parts == *,tests,* ]]; then
    step fsdp_nccl_test 150 "log-prob error|passed|failed|FAILED|Error|^E " env CUDA_VISIBLE_DEVICES=0,1 \
        python3 -m pytest -q -s -x --tb=short -p no:cacheprovider tests/workers/test_fsdp_nccl.py
    step tp_nccl_test 150 "passed|failed|FAILED|Error|^E " env CUDA_VISIBLE_DEVICES=0,1 python3 -m pytest -q -x \
        --tb=short -p no:cacheprovider \
        tests/engine/test_tensor_parallel.py::test_tp2_on_two_gpus_with_nccl_and_cuda_graphs_equals_tp1
fi
if [[ $parts == *,sync,* ]]; then
    step "sync_7b_${gpus}gpu_tp1" 300 "s/sync|weight sync|Error" "${torchrun_n[@]}" benchmarks/weight_sync.py --shape 7b \
        --compare-full
    step "sync_7b_${gpus}gpu_tp$tp" 300 "s/sync|weight sync|Error" "${torchrun_n[@]}" benchmarks/weight_sync.py --shape 7b \
        --tp "$tp" --compare-full
fi
if [[ $parts == *,sync32b,* ]] && (( gpus == 8 )); then
    step sync_32b_8gpu_tp8 420 "s/sync|weight sync|Error" "${torchrun_n[@]}" benchmarks/weight_sync.py --shape 32b \
        --tp 8 --master-dtype bf16 --compare-full
fi
if [[ $parts == *,actor,* ]]; then
    step actor_1.5b_1gpu 240 "ms/step|params|Error" env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/actor_update.py \
        --only hyflow --shape 1.5b --micro-batch-size 16
    step "actor_1.5b_${gpus}gpu" 300 "ms/step|ranks|params|Error" "${torchrun_n[@]}" benchmarks/actor_update.py \
        --shape 1.5b --micro-batch-size 16
fi
if [[ $parts == *,actor7b,* ]]; then
    # 7B: fp32 master weights + AdamW (16 bytes a parameter, 122 GB) do not fit one H200: 2 GPUs are the baseline.
    actor_7b=(benchmarks/actor_update.py --shape 7b --micro-batch-size 4 --gradient-checkpointing)
    step actor_7b_2gpu 300 "ms/step|ranks|params|Error" env CUDA_VISIBLE_DEVICES=0,1 \
        python3 -m torch.distributed.run --nproc-per-node 2 "${actor_7b[@]}"
    if (( gpus > 2 )); then
        step "actor_7b_${gpus}gpu" 300 "ms/step|ranks|params|Error" "${torchrun_n[@]}" "${actor_7b[@]}"
    fi
fi
if [[ $parts == *,rollout,* ]]; then
    step rollout_tp1 150 "^case|device=" env CUDA_VISIBLE_DEVICES=0 \
        python3 benchmarks/rollout_throughput.py --no-hf --no-vllm --cases a,b,c
    step rollout_tp2 200 "^case|device=|Error" env CUDA_VISIBLE_DEVICES=0,1 python3 -m torch.distributed.run \
        --nproc-per-node 2 benchmarks/rollout_throughput.py --no-vllm --tensor-parallel-size 2 --cases a,b,c
fi
show="GRPO step on|steps 2-|generated|tok/s|hyflow |Error"
if [[ $parts == *,grpo,* ]]; then
    step grpo_0.5b_1gpu 150 "$show" env CUDA_VISIBLE_DEVICES=0 \
        python3 benchmarks/grpo_step.py --only hyflow --prompts 16 --steps 3
    step "grpo_0.5b_ray_${gpus}gpu" 240 "$show" \
        python3 benchmarks/grpo_step.py --backend ray --gpus "$gpus" --prompts $(( 8 * gpus )) --steps 3
fi
grpo_7b=(--shape 7b --master-dtype bf16 --micro-batch-size 8 --log-prob-micro-batch-size 16 --steps 3)
if [[ $parts == *,grpo7b1,* ]]; then
    step grpo_7b_1gpu 420 "$show" env CUDA_VISIBLE_DEVICES=0 \
        python3 benchmarks/grpo_step.py --only hyflow "${grpo_7b[@]}" --prompts 8
fi
if [[ $parts == *,grpo7b,* ]]; then
    step "grpo_7b_ray_${gpus}gpu" 480 "$show" \
        python3 benchmarks/grpo_step.py --backend ray --gpus "$gpus" "${grpo_7b[@]}" --prompts $(( 8 * gpus ))
fi
if [[ $parts == *,grpo32b,* ]] && (( gpus == 8 )); then
    step grpo_32b_ray_8gpu_tp8 600 "$show" python3 benchmarks/grpo_step.py --backend ray --gpus 8 --tp 8 \
        --shape 32b --master-dtype bf16 --micro-batch-size 2 --log-prob-micro-batch-size 4 --prompts 16 --steps 3
fi
if [[ $parts == *,nemo1,* ]]; then
    step grpo_7b_nemo_rl_1gpu 420 "$show" env CUDA_VISIBLE_DEVICES=0 \
        python3 benchmarks/grpo_step.py --only hyflow "${NEMO_RL_SHAPE[@]}" --prompts 4
fi
if [[ $parts == *,nemo,* ]]; then
    step "grpo_7b_nemo_rl_ray_${gpus}gpu" 540 "$show" \
        python3 benchmarks/grpo_step.py --backend ray --gpus "$gpus" "${NEMO_RL_SHAPE[@]}" --prompts $(( 4 * gpus ))
fi
# async: fully async requests of 256 rows an engine (async_training.chunk_prompts=0, auto: async_rl.py's cuda default)
if [[ $parts == *,async,* ]]; then
    step "async_rl_0.5b_${gpus}gpu" 540 "GPU|mode|colocated|sync|one_step_off|async1|Error" \
        python3 benchmarks/async_rl.py --device cuda --gpus "$gpus" --steps 6 \
        --modes colocated,sync,one_step_off,async1 --prompts $(( gpus < 4 ? 64 : 16 * gpus ))
fi
if [[ $parts == *,async7b,* ]]; then
    step "async_rl_7b_${gpus}gpu" 590 "GPU|mode|colocated|sync|one_step_off|Error" \
        python3 benchmarks/async_rl.py --device cuda --gpus "$gpus" --shape 7b --master-dtype bf16 \
        --gradient-checkpointing --micro-batch-size 8 --gpu-memory-utilization 0.6 --steps 4 \
        --modes colocated,sync,one_step_off --prompts 32
fi
