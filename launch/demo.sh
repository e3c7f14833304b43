#!/usr/bin/env bash
# The main job on the embedded demo default. For now: load the shipped tiny LLaVA checkpoint and run
# forward+backward on its shipped sample, printing loss and timing.
set -euo pipefail
cd "$(dirname "$0")/.."
launch/build.sh gmod >&2
build/bin/gmod forward --model tests/fixtures/hf/llava_layer_m2 --steps 3 "$@"
