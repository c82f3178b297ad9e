# Sourced by run_gpu_suite.sh and run_multi_gpu_suite.sh: the results folder and the parts to run from the
# arguments, and `step`, which runs one command under a time limit, keeps its log and prints the lines that matter.
#   results_and_parts "$@" DEFAULT_PARTS  # sets $results (default: $OUT, else ./gpu_results) and $parts
#   step NAME SECONDS PATTERN COMMAND...

results_and_parts() {
    results="${1:-${OUT:-gpu_results}}"
    parts=",${2:-$3},"
    mkdir -p "$results"
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)" PYTHONUNBUFFERED=1
}

step() {
    local name=$1 limit=$2 pattern=$3
    shift 3
    timeout "$limit" "$@" >"$results/$name.log" 2>&1
    echo "== $name (exit $?)"
    grep -E "$pattern" "$results/$name.log" | tail -20
}
