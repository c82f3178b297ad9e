#!/usr/bin/env bash
# The 2-GPU checks and benchmarks (issue #10) in one go, each beside its one-GPU counterpart of the same run:
#   bash benchmarks/run_multi_gpu_suite.sh [results-folder] [parts]  # default: $OUT, else ./gpu_results; all parts
# Parts (comma-separated): tests — the NCCL tests (FSDP2 update on 2 GPUs == 1 GPU, engine TP=2 == TP=1);
# actor — the actor update on 1 and 2 GPUs; rollout — the generation engine at TP=1 and TP=2 (engines = both);
# grpo — a GRPO step on 1 GPU (local backend) and on 2 Ray workers (needs Ray). About 2-5 minutes a part.
# NVLink multicast stays off, as the machines that lend several GPUs ask.
set -uo pipefail
source "$(dirname "$0")/suite_step.sh"
results_and_parts "${1:-}" "${2:-}" tests,actor,rollout,grpo
[[ $parts == *,engines,* ]] && parts="$parts,actor,rollout,"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled

if [[ $parts == *,tests,* ]]; then
    step fsdp_nccl_test 150 "log-prob error|passed|failed|FAILED|Error|^E " \
        python3 -m pytest -q -s -x --tb=short -p no:cacheprovider tests/workers/test_fsdp_nccl.py
    step tp_nccl_test 150 "passed|failed|FAILED|Error|^E " python3 -m pytest -q -x --tb=short -p no:cacheprovider \
        tests/engine/test_tensor_parallel.py::test_tp2_on_two_gpus_with_nccl_and_cuda_graphs_equals_tp1
fi
if [[ $parts == *,actor,* ]]; then
    step actor_1gpu 120 "ms/step|params" env CUDA_VISIBLE_DEVICES=0 \
        python3 benchmarks/actor_update.py --only hyflow --micro-batch-size 16
    step actor_2gpu 150 "ms/step|ranks|params|Error" python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/actor_update.py \
        --micro-batch-size 16
fi
if [[ $parts == *,rollout,* ]]; then
    step rollout_tp1 150 "^case|device=" env CUDA_VISIBLE_DEVICES=0 \
        python3 benchmarks/rollout_throughput.py --no-hf --cases a,b,c
    step rollout_tp2 200 "^case|device=|Error" python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/rollout_throughput.py \
        --tensor-parallel-size 2 --cases a,b,c
fi
if [[ $parts == *,grpo,* ]]; then
    step grpo_1gpu 150 "GRPO step on|steps 2-|generated|hyflow " env CUDA_VISIBLE_DEVICES=0 \
        python3 benchmarks/grpo_step.py --only hyflow --prompts 16 --steps 3
    step grpo_ray_2gpu 170 "GRPO step on|steps 2-|generated|hyflow |Error" \
        python3 benchmarks/grpo_step.py --backend ray --gpus 2 --prompts 16 --steps 3
fi
