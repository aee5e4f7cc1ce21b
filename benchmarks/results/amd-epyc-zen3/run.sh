#!/usr/bin/env bash
# The CPU benchmark set of this folder (2-core AMD EPYC, Zen 3: AVX2 + FMA + F16C, no AVX-512): issue #9's
# targets on the AVX2-only CPU kind it was filed on. Run it on an otherwise idle machine (check `top` first);
# the runs go one after the other, each output file starting with its command and its start time. Peers:
# `CMAKE_ARGS="-DGGML_NATIVE=ON" pip install -e ".[llamacpp]"` builds llama.cpp for this CPU (AVX2 here).
set -uo pipefail
cd "$(dirname "$0")"
solo="${SOLO:-solo}"
. ../run_logged.sh  # run NAME CMD... (output in NAME.txt); ttft512_runs, quantized_runs, cpu_hog_run

# bf16 decode (prompt 128, 256 generated) and TTFT at 128 against llama.cpp's F16 and BF16 GGUFs and
# transformers eager.
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-bf16" $solo bench --shape "$shape" --energy-s 0 --compare llama.cpp,hf-eager --json "$shape-bf16.json"
done
# TTFT at 512 tokens.
ttft512_runs
# int8 against Q8_0, int4 against Q4_0.
quantized_runs
# Beside one busy-loop process (one of the two cores taken by other work).
cpu_hog_run
# After the 1 KiB software prefetch on Zen 3 (cpu_build.prefetch_distance_bytes): bf16 decode and int8 again.
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-bf16-prefetch1k" $solo bench --shape "$shape" --energy-s 0 --compare llama.cpp \
    --json "$shape-bf16-prefetch1k.json"
done
run Qwen2.5-0.5B-int8-prefetch1k $solo bench --shape Qwen2.5-0.5B --quantize int8 --gen-len 128 --energy-s 0 \
  --compare llama.cpp --json Qwen2.5-0.5B-int8-prefetch1k.json
# The same in turns of 16 tokens (each turn against its own probes; each peer's turn paired with Solo's before it).
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-bf16-lockstep" $solo bench --shape "$shape" --energy-s 0 --compare llama.cpp --lockstep 16 \
    --json "$shape-bf16-lockstep.json"
done
