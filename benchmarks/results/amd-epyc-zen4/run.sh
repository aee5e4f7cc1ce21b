#!/usr/bin/env bash
# The CPU benchmark set of this folder (2-core AMD EPYC, Zen 4: AVX-512 + AVX512-BF16 + VNNI, no AMX).
# Run it on an otherwise idle machine (check `top` first). Peers: `pip install -e ".[llamacpp]"` with
# CMAKE_ARGS="-DGGML_NATIVE=ON" builds llama.cpp for this CPU. For the AVX2 proxy rows, LLAMA_CPP_AVX2_LIB
# names the folder of a second libllama.so built from the same llama.cpp sources with -DGGML_NATIVE=OFF
# -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF (llama-cpp-python loads it
# through LLAMA_CPP_LIB_PATH); without it those rows run Solo alone.
set -euo pipefail
cd "$(dirname "$0")"
solo="${SOLO:-solo}"
run() { echo "+ $*"; "$@"; }
avx2_peer=()
if [ -n "${LLAMA_CPP_AVX2_LIB:-}" ]; then avx2_peer=(--compare llama.cpp); fi

for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  # bf16 decode against the roofline, llama.cpp's F16 and BF16 GGUFs and transformers (TTFT at 128 tokens too).
  run $solo bench --shape "$shape" --compare llama.cpp,hf --json "$shape-bf16.json" | tee "$shape-bf16.txt"
  # The AVX2 kernels with oneDNN capped at AVX2, against an AVX2-only llama.cpp: a proxy for an AVX2-only CPU.
  run env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" \
    $solo bench --shape "$shape" "${avx2_peer[@]}" --json "$shape-bf16-avx2-proxy.json" \
    | tee "$shape-bf16-avx2-proxy.txt"
done
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run $solo bench --shape "$shape" --prompt-len 512 --gen-len 16 --compare llama.cpp \
    --json "$shape-ttft512.json" | tee "$shape-ttft512.txt"
  run $solo bench --shape "$shape" --quantize int8 --compare llama.cpp --json "$shape-int8.json" \
    | tee "$shape-int8.txt"
done
run $solo bench --shape Qwen2.5-0.5B --quantize int4 --compare llama.cpp --json Qwen2.5-0.5B-int4.json \
  | tee Qwen2.5-0.5B-int4.txt
# Beside one busy-loop process (one of the two cores taken by other work).
run $solo bench --shape Qwen2.5-0.5B --gen-len 64 --cpu-hog 1 --compare llama.cpp \
  --json Qwen2.5-0.5B-bf16-cpu-hog.json | tee Qwen2.5-0.5B-bf16-cpu-hog.txt
