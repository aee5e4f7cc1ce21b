#!/usr/bin/env bash
# The CPU benchmark set behind benchmarks/results/README.md. Run it on an otherwise idle machine (check
# `top` first): other processes on the cores turn every number into a measurement of the scheduler.
# Peers are optional; install them with `pip install solo[llamacpp]` (see README.md for the build used).
set -euo pipefail
cd "$(dirname "$0")"
solo="${SOLO:-solo}"
run() { echo "+ $*"; "$@"; }

for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run $solo bench --shape "$shape" --compare hf,llama.cpp --json "$shape-bf16.json" | tee "$shape-bf16.txt"
  run $solo bench --shape "$shape" --quantize int8 --compare llama.cpp --json "$shape-int8.json" \
    | tee "$shape-int8.txt"
  run $solo bench --shape "$shape" --prompt-len 512 --gen-len 16 --compare llama.cpp \
    --json "$shape-ttft512.json" | tee "$shape-ttft512.txt"
done
run $solo bench --shape Qwen2.5-0.5B --quantize int4 --compare llama.cpp --json Qwen2.5-0.5B-int4.json \
  | tee Qwen2.5-0.5B-int4.txt
run $solo bench --shape Qwen2.5-0.5B --gen-len 64 --repeats 1 --compare hf-eager,llama.cpp --sweep-context \
  --contexts 128,512,1024,2048,4096 --json Qwen2.5-0.5B-sweep.json --plot Qwen2.5-0.5B-sweep.png \
  | tee Qwen2.5-0.5B-sweep.txt
for shape in SmolLM2-135M Laneformer-2B; do
  run $solo bench --shape "$shape" --compare llama.cpp --json "$shape-bf16.json" | tee "$shape-bf16.txt"
done
run $solo bench --shape Llama-3.1-8B --gen-len 64 --repeats 2 --json Llama-3.1-8B-bf16.json \
  | tee Llama-3.1-8B-bf16.txt
# ISA levels: the best level of this CPU, then the AVX2 kernels with oneDNN capped at AVX2 (a proxy for an
# AVX2-only CPU on an AVX-512 machine).
run $solo bench --shape Qwen2.5-0.5B --gen-len 64 --repeats 1 --json Qwen2.5-0.5B-bf16-isa-native.json \
  | tee Qwen2.5-0.5B-bf16-isa-native.txt
run env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $solo bench --shape Qwen2.5-0.5B --gen-len 64 --repeats 1 \
  --json Qwen2.5-0.5B-bf16-isa-avx2-proxy.json | tee Qwen2.5-0.5B-bf16-isa-avx2-proxy.txt
