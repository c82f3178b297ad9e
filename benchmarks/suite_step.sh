# Sourced by run_gpu_suite.sh and run_multi_gpu_suite.sh: the results folder and the parts to run from the
# arguments, and `step`, which runs one command under a time limit, keeps its log and prints the lines that matter.
#   results_and_parts "$@" DEFAULT_PARTS  # sets $results (default: $OUT, else ./gpu_results) and $parts
#   step NAME SECONDS PATTERN COMMAND...
# DRY_RUN=1 prints each step's name, time limit and command (tab-separated, the command shell-quoted on one line)
# instead of running it: tests/benchmarks/test_suite_commands.py parses every command with its script's parser.

results_and_parts() {
    results="${1:-${OUT:-gpu_results}}"
    parts=",${2:-$3},"
    mkdir -p "$results"
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)" PYTHONUNBUFFERED=1
}

step() {
    local name=$1 limit=$2 pattern=$3
    shift 3
    if [[ ${DRY_RUN:-0} == 1 ]]; then
        printf '%s\t%s\t' "$name" "$limit"
        printf '%q ' "$@"
        printf '\n'
        return 0
    fi
    timeout "$limit" "$@" >"$results/$name.log" 2>&1
    echo "== $name (exit $?)"
    grep -E "$pattern" "$results/$name.log" | tail -20
}

# NeMo-RL's Llama-3.1-8B GRPO shape (its performance summary, v0.5: 16 H100s, 64 prompts x 32 generations = 2,048
# samples a step, 128 a GPU, ~1,020 generated tokens, training batch 512 = 4 optimizer steps, k3 KL 0.01 to a
# reference) per GPU, at the Qwen2.5-7B shape: 4 prompts x 32 a GPU (--prompts 4 x GPUs), 128 -> 1,024 tokens.
# grpo_step.py reports its `total tok/s/GPU (NeMo-RL)`: prompt + response tokens over the step, over all GPUs.
NEMO_RL_SHAPE=(--shape 7b --master-dtype bf16 --n 32 --prompt-length 128 --response-length 1024 --mini-batches 4
    --kl-loss-coef 0.01 --micro-batch-size 2 --log-prob-micro-batch-size 4 --steps 3)
