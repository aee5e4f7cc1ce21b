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
  # bf16 decode against the roofline and llama.cpp's F16 and BF16 GGUFs (TTFT at 128 tokens too); add hf to
  # --compare for transformers (measured only before the prefetch and huge-page changes: README.md).
  run $solo bench --shape "$shape" --compare llama.cpp --json "$shape-bf16.json" | tee "$shape-bf16.txt"
  # Not in this set's files yet (the numbers in README.md are from before those changes): the AVX2 kernels with oneDNN capped at AVX2, against an AVX2-only llama.cpp: a proxy for an AVX2-only CPU.
  run env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" \
    $solo bench --shape "$shape" "${avx2_peer[@]}" --json "$shape-bf16-avx2-proxy.json" \
    | tee "$shape-bf16-avx2-proxy.txt"
done
# TTFT at 512 tokens, int8 against Q8_0 and the CPU-hog case (the 0.5B shape; this set's runs).
run $solo bench --shape Qwen2.5-0.5B --quantize int8 --gen-len 128 --compare llama.cpp \
  --json Qwen2.5-0.5B-int8.json | tee Qwen2.5-0.5B-int8.txt
run $solo bench --shape Qwen2.5-0.5B --prompt-len 512 --gen-len 16 --compare llama.cpp \
  --json Qwen2.5-0.5B-ttft512.json | tee Qwen2.5-0.5B-ttft512.txt
# Beside one busy-loop process (one of the two cores taken by other work).
run $solo bench --shape Qwen2.5-0.5B --gen-len 64 --cpu-hog 1 --compare llama.cpp \
  --json Qwen2.5-0.5B-bf16-cpu-hog.json | tee Qwen2.5-0.5B-bf16-cpu-hog.txt
run $solo bench --shape Llama-3.2-1B --quantize int8 --gen-len 128 --compare llama.cpp \
  --json Llama-3.2-1B-int8.json | tee Llama-3.2-1B-int8.txt
run $solo bench --shape Llama-3.2-1B --prompt-len 512 --gen-len 16 --compare llama.cpp \
  --json Llama-3.2-1B-ttft512.json | tee Llama-3.2-1B-ttft512.txt
# Not run in this set yet: int4 against Q4_0.
