#!/usr/bin/env bash
# TTFT on the AVX2 kernels after the pass tiles (tile.h), against an AVX2-only llama.cpp (see run.sh for
# LLAMA_CPP_AVX2_LIB): prompt 128 on Llama-3.2-1B, prompt 512 on Qwen2.5-0.5B.
set -uo pipefail
cd "$(dirname "$0")"
solo="${SOLO:-solo}"
run() {
  local name=$1; shift
  { echo "+ $*"; echo "# $(date -u +%T) UTC start"; } > "$name.txt"
  "$@" >> "$name.txt" 2>&1
  echo "# $(date -u +%T) UTC exit $?" >> "$name.txt"
}
peer=()
if [ -n "${LLAMA_CPP_AVX2_LIB:-}" ]; then peer=(--compare llama.cpp); fi
run Llama-3.2-1B-avx2-proxy-pass-tiles env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
  LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" $solo bench --shape Llama-3.2-1B --gen-len 32 --energy-s 0 \
  "${peer[@]}" --json Llama-3.2-1B-avx2-proxy-pass-tiles.json
run Qwen2.5-0.5B-ttft512-avx2-proxy-pass-tiles env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
  LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" $solo bench --shape Qwen2.5-0.5B --prompt-len 512 --gen-len 16 \
  --energy-s 0 "${peer[@]}" --json Qwen2.5-0.5B-ttft512-avx2-proxy-pass-tiles.json
