#!/usr/bin/env bash
# Unpacks pack_verl.sh's tarball into a folder for grpo_step.py's --verl-path, restoring the executable bits that a
# wheel's zip loses (Ray's gcs_server, raylet and shared objects):
#     bash benchmarks/peers/unpack_verl.sh verlsite.tar.xz /tmp/verlsite
set -euo pipefail
mkdir -p "$2"
xz -d -T0 < "$1" | tar -x -C "$2"
find "$2/ray/core" -type f \( -name 'gcs_server' -o -name 'raylet' -o -name '*.so' \) -exec chmod +x {} +
find "$2/ray" -maxdepth 1 -name '*.so' -exec chmod +x {} +
echo "verl's site unpacked into $2 ($(ls "$2" | wc -l) entries)"
