#!/usr/bin/env bash
# Packs verl 0.9.0 and the versions it pins that the GPU machine lacks (or holds at another version) into one xz
# tarball for `grpo_step.py --only ...,verl --verl-path ...` (see grpo_step_verl.py):
#     bash benchmarks/peers/pack_verl.sh DEST      # writes DEST/verlsite.tar.xz (~35 MB; 2-4 min, needs PyPI)
# On the GPU machine (Python 3.12, torch 2.11, no package index), after vLLM 0.25.0 is unpacked into /tmp/vsite
# (../shared/peers/unpack_vllm.sh):
#     bash benchmarks/peers/unpack_verl.sh DEST/verlsite.tar.xz /tmp/verlsite
#     python3 benchmarks/grpo_step.py --only hyflow,verl --verl-path /tmp/verlsite:/tmp/verlsite/_td010:/tmp/vsite:/tmp/site
# What goes in, and why:
#   verl 0.9.0 (its wheel holds the source), transfer_queue 0.1.11 (verl 0.9's default trainer, `use_v1`, needs it)
#     with pyzmq and msgspec;
#   Ray 2.60.0 without its jars and its RLlib/Serve/Tune/Train/LLM/Data folders (verl uses Ray Core only; the whole
#     wheel is ~80 MB) and what Ray Core imports that the machine lacks (jsonschema, referencing, rpds-py, ...);
#   transformers 5.10.2 (verl asks < 5.11; the machine has 5.17) with tokenizers 0.22.2 (transformers 5.10 asks
#     0.22.x; the machine has 0.23);
#   tensordict 0.10.0 + pyvers 0.1.0 in `_td010/` (verl asks <= 0.10; hyflow's own side keeps 0.15);
#   codetiming, torchdata, pylatexenc, orjson, omegaconf/hydra (verl's config).
set -euo pipefail
dest=$(realpath -m "${1:?usage: pack_verl.sh DEST}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps)
for n in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
site="$work/site"
mkdir -p "$site/_td010" "$work/wheels"
python3 -m pip download -q "${plat[@]}" -d "$work/wheels" \
    verl==0.9.0 transferqueue==0.1.11 pyzmq msgspec ray==2.60.0 \
    transformers==5.10.2 tokenizers==0.22.2 codetiming torchdata orjson \
    jsonschema jsonschema-specifications referencing rpds-py \
    omegaconf==2.3.1 hydra-core==1.3.2 aiohttp-cors colorful opencensus opencensus-context smart-open \
    google-api-core googleapis-common-protos proto-plus py-spy
# pure-Python sdists, built here into wheels
(cd "$work/wheels" && python3 -m pip wheel -q --no-deps pylatexenc==2.10 antlr4-python3-runtime==4.9.3)
for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$site"; done
python3 -m pip download -q "${plat[@]}" -d "$work/td" tensordict==0.10.0 pyvers==0.1.0
for w in "$work"/td/*.whl; do python3 -m zipfile -e "$w" "$site/_td010"; done
# Ray Core only: verl starts workers and placement groups, nothing else
rm -rf "$site"/ray/jars "$site"/ray/rllib "$site"/ray/serve "$site"/ray/tune "$site"/ray/train "$site"/ray/llm \
       "$site"/ray/data "$site"/ray/air/examples "$site"/ray/tests
find "$site" -name '__pycache__' -prune -exec rm -rf {} +
mkdir -p "$dest"
tar -cf - -C "$site" . | xz -T0 -6 > "$dest/verlsite.tar.xz"
ls -la "$dest/verlsite.tar.xz"
