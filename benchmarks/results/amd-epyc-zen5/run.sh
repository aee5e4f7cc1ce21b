#!/usr/bin/env bash
# The CPU benchmark set of this folder (2-core AMD EPYC, Zen 5: AVX-512 + AVX512-BF16 + VNNI, no AMX).
# Run it on an otherwise idle machine (check `top` first); the runs go one after the other, each output
# file starting with its command and its start time. Peers: `pip install -e ".[llamacpp]"` with
# CMAKE_ARGS="-DGGML_NATIVE=ON" builds llama.cpp for this CPU. For the AVX2 proxy rows, LLAMA_CPP_AVX2_LIB
# names the folder of a second libllama.so built from the same llama.cpp sources with -DGGML_NATIVE=OFF
# -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF (llama-cpp-python loads it
# through LLAMA_CPP_LIB_PATH); without it those rows run Solo alone.
set -uo pipefail
cd "$(dirname "$0")"
solo="${SOLO:-solo}"
. ../run_logged.sh  # run NAME CMD... (output in NAME.txt); ttft512_runs, quantized_runs, cpu_hog_run
avx2_peer=()
if [ -n "${LLAMA_CPP_AVX2_LIB:-}" ]; then avx2_peer=(--compare llama.cpp); fi

# bf16 decode (prompt 128, 256 generated) and TTFT at 128 against llama.cpp's F16 and BF16 GGUFs.
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-bf16" $solo bench --shape "$shape" --energy-s 0 --compare llama.cpp --json "$shape-bf16.json"
done
# TTFT at 512 tokens.
ttft512_runs
# The AVX2 kernels with oneDNN capped at AVX2, against an AVX2-only llama.cpp: a proxy for an AVX2-only CPU.
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-bf16-avx2-proxy" env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
    LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" $solo bench --shape "$shape" --gen-len 128 --energy-s 0 \
    "${avx2_peer[@]}" --json "$shape-bf16-avx2-proxy.json"
done
# int8 against Q8_0, int4 against Q4_0.
quantized_runs
# Beside one busy-loop process (one of the two cores taken by other work).
cpu_hog_run
# MoE: the full OLMoE-1B-7B in bf16 (13.8 GB: llama.cpp runs after Solo's weights are freed).
run OLMoE-1B-7B-bf16 timeout 900 $solo bench --shape OLMoE-1B-7B --prompt-len 32 --gen-len 64 --repeats 3 \
  --energy-s 0 --compare llama.cpp-BF16 --peers-after-solo --json OLMoE-1B-7B-bf16.json
# Long context: decode after a KV cache of random values, to the shape's full context.
run Qwen2.5-0.5B-long-context $solo bench --shape Qwen2.5-0.5B --gen-len 16 --repeats 1 --energy-s 0 \
  --sweep-context --contexts 128,1024,4096,8192,16384,32704 --sweep-gen-len 32 --sweep-fill random \
  --json Qwen2.5-0.5B-long-context.json --plot Qwen2.5-0.5B-long-context.png
# Serving: chat workload at 80% of the measured capacity, every greedy answer checked.
run load-chat-0.8x $solo bench --load chat --rates 0.8x --duration 120 --capacity-s 30 --verify 32 \
  --max-queue-wait 0.1 --json load-chat-0.8x.json --markdown load-chat-0.8x.md
# After the pass tiles (tile.h, AVX2): TTFT on the AVX2 kernels against the AVX2-only llama.cpp, prompt 128 on
# Llama-3.2-1B and prompt 512 on Qwen2.5-0.5B.
run Llama-3.2-1B-avx2-proxy-pass-tiles env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
  LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" $solo bench --shape Llama-3.2-1B --gen-len 32 --energy-s 0 \
  "${avx2_peer[@]}" --json Llama-3.2-1B-avx2-proxy-pass-tiles.json
run Qwen2.5-0.5B-ttft512-avx2-proxy-pass-tiles env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
  LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" $solo bench --shape Qwen2.5-0.5B --prompt-len 512 --gen-len 16 \
  --energy-s 0 "${avx2_peer[@]}" --json Qwen2.5-0.5B-ttft512-avx2-proxy-pass-tiles.json
# After the p @ v change (elementwise.h: a GQA group's leftover heads as one block): the long-context sweep again.
run Qwen2.5-0.5B-long-context-pv-rest $solo bench --shape Qwen2.5-0.5B --gen-len 16 --repeats 1 --energy-s 0 \
  --sweep-context --contexts 128,1024,4096,8192,16384,32704 --sweep-gen-len 32 --sweep-fill random \
  --json Qwen2.5-0.5B-long-context-pv-rest.json --plot Qwen2.5-0.5B-long-context-pv-rest.png
# After the int8 integer-dot pass tiles (tile.h): int8 TTFT against Q8_0 again (32 generated).
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-int8-pass-tiles" $solo bench --shape "$shape" --quantize int8 --gen-len 32 --energy-s 0 \
    --compare llama.cpp --json "$shape-int8-pass-tiles.json"
done
# Batched decode (8 rows) with and without the pass tiles: why they wait for 32 sequences.
run batch-decode-pass-tiles-int8 python ../../batch_decode_ab.py --shape Qwen2.5-0.5B --quantize int8 --batch 8 \
  --variant decode-tiles=q8_rt=0,pass_min_b=1 --variant pass-tiles=q8_rt=-1,pass_min_b=1 \
  --variant default=q8_rt=-1,pass_min_b=32
# Session of 2026-12-02, 06:43 UTC on: the AVX512-BF16 pass tile (tile.h, 4 x 6, k blocks outside the row loop)
# for the down projections; TTFT at 128 (32 generated) and at 512 tokens against llama.cpp again.
for shape in Llama-3.2-1B Qwen2.5-0.5B; do
  run "$shape-ttft128-bf16-pass-tile" $solo bench --shape "$shape" --gen-len 32 --energy-s 0 --compare llama.cpp \
    --json "$shape-ttft128-bf16-pass-tile.json"
done
for shape in Llama-3.2-1B Qwen2.5-0.5B; do
  run "$shape-ttft512-bf16-pass-tile" $solo bench --shape "$shape" --prompt-len 512 --gen-len 16 --energy-s 0 \
    --compare llama.cpp --json "$shape-ttft512-bf16-pass-tile.json"
done
# The 512-bit int4 pass tile (tile.h): int4 TTFT against Q4_0; the 1B TTFT at 128 with 5 repeats.
run Qwen2.5-0.5B-int4-pass-tile $solo bench --shape Qwen2.5-0.5B --quantize int4 --gen-len 32 --energy-s 0 \
  --compare llama.cpp --json Qwen2.5-0.5B-int4-pass-tile.json
run Llama-3.2-1B-ttft128-bf16-pass-tile-r5 $solo bench --shape Llama-3.2-1B --gen-len 32 --repeats 5 --energy-s 0 \
  --compare llama.cpp-BF16 --json Llama-3.2-1B-ttft128-bf16-pass-tile-r5.json
# After the bf16 q . k and the KV prefetch in attention (elementwise.h): the long-context sweep again.
run Qwen2.5-0.5B-long-context-bf16-qk $solo bench --shape Qwen2.5-0.5B --gen-len 16 --repeats 1 --energy-s 0 \
  --sweep-context --contexts 128,1024,4096,8192,16384,32704 --sweep-gen-len 32 --sweep-fill random \
  --json Qwen2.5-0.5B-long-context-bf16-qk.json --plot Qwen2.5-0.5B-long-context-bf16-qk.png
# Same-process A/Bs: the span prefill with and without the bf16 and int4 pass tiles, attention's KV prefetch.
# (The int4 runs below were recorded when the 512-bit tile's knob was still called q4_rt; it is qz_rt now.)
for shape in Llama-3.2-1B Qwen2.5-0.5B; do
  run "span-prefill-bf16-pass-tile-$shape" python ../../prefill_ab.py --shape $shape --prompt-len 128 --rounds 3 \
    --variant decode-tiles=span_tile=0 --variant pass-tile=span_tile=1
  run "span-prefill-int4-pass-tile-$shape" python ../../prefill_ab.py --shape $shape --quantize int4 --prompt-len 128 \
    --rounds 3 --variant decode-kernel=qz_rt=0 --variant pass-tile=qz_rt=44
done
run attention-prefetch-Qwen2.5-0.5B-32000 python ../../attention_ab.py --shape Qwen2.5-0.5B --context 32000 \
  --variant off=attn_prefetch=0 --variant on=attn_prefetch=2
# The 512-bit pass tile for int8 too (tile.h: tile_q8_zmm_pass): the span prefill against the 256-bit pass tile,
# then int8 TTFT against Q8_0 again.
for shape in Llama-3.2-1B Qwen2.5-0.5B; do
  run "span-prefill-int8-zmm-pass-tile-$shape" python ../../prefill_ab.py --shape $shape --quantize int8 \
    --prompt-len 128 --rounds 3 --variant ymm-pass-tile=qz_rt=0 --variant zmm-pass-tile=qz_rt=44
done
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-int8-zmm-pass-tile" $solo bench --shape "$shape" --quantize int8 --gen-len 32 --energy-s 0 \
    --compare llama.cpp --json "$shape-int8-zmm-pass-tile.json"
done
# The long-context sweep again, once more with the bench's per-point bandwidth probes (twice, back to back).
run Qwen2.5-0.5B-long-context-bf16-qk-rerun $solo bench --shape Qwen2.5-0.5B --gen-len 16 --repeats 1 --energy-s 0 \
  --sweep-context --contexts 128,1024,4096,8192,16384,32704 --sweep-gen-len 32 --sweep-fill random \
  --json Qwen2.5-0.5B-long-context-bf16-qk-rerun.json --plot Qwen2.5-0.5B-long-context-bf16-qk-rerun.png
for k in 1 2; do
  run Qwen2.5-0.5B-long-context-point-probes-$k $solo bench --shape Qwen2.5-0.5B --gen-len 16 --repeats 1 \
    --energy-s 0 --sweep-context --contexts 128,1024,4096,8192,16384,32704 --sweep-gen-len 32 --sweep-fill random \
    --json Qwen2.5-0.5B-long-context-point-probes-$k.json --plot Qwen2.5-0.5B-long-context-point-probes-$k.png
done
# bf16 decode of the 0.5B shape again, 5 repeats.
run Qwen2.5-0.5B-bf16-r5 $solo bench --shape Qwen2.5-0.5B --repeats 5 --energy-s 0 --compare llama.cpp \
  --json Qwen2.5-0.5B-bf16-r5.json
# Serving: the issue's load command before and after the prefix-cache index, then with the sampling change
# (the code at each commit; bundled model; each run measures its own capacity first).
for name in load-chat-0.8x-before-prefix-index load-chat-0.8x-prefix-index load-chat-0.8x-prefix-index-sampling; do
  $solo bench --load chat --rates 0.8x --duration 120 --capacity-s 30 --verify 32 --max-queue-wait 0.1 \
    --json "$name.json" --markdown "$name.md"
done
# bf16 decode of the 0.5B shape on the final code of the session (a check, no kernel change in it).
run Qwen2.5-0.5B-bf16-final-2026-12-02 $solo bench --shape Qwen2.5-0.5B --gen-len 64 --energy-s 0 --compare llama.cpp \
  --json Qwen2.5-0.5B-bf16-final-2026-12-02.json
# Session 3: each timed run with its own bandwidth probes (pt roof).
run Qwen2.5-0.5B-bf16-point-probes $solo bench --shape Qwen2.5-0.5B --gen-len 128 --repeats 5 --energy-s 0 \
  --compare llama.cpp --json Qwen2.5-0.5B-bf16-point-probes.json
run Qwen2.5-0.5B-bf16-256-point-probes $solo bench --shape Qwen2.5-0.5B --gen-len 256 --repeats 5 --energy-s 0 \
  --compare llama.cpp --json Qwen2.5-0.5B-bf16-256-point-probes.json
run OLMoE-1B-7B-bf16-point-probes $solo bench --shape OLMoE-1B-7B --prompt-len 32 --gen-len 64 --repeats 5 \
  --energy-s 0 --compare llama.cpp-BF16 --peers-after-solo --json OLMoE-1B-7B-bf16-point-probes.json

# Session 4: the garbage collector's pauses. The issue's serving command (each run measures its own capacity;
# for the "before" rows, the same command on a checkout of the commit before the frozen heap).
$solo bench --load chat --rates 0.8x --duration 120 --capacity-s 30 --verify 32 --max-queue-wait 0.1 \
  --json load-chat-0.8x-gc-freeze.json --markdown load-chat-0.8x-gc-freeze.md
# The collector's own timings at 20 req/s (SOLO_NO_GC_FREEZE=1 for the before), from the repository root:
#   [SOLO_NO_GC_FREEZE=1] python scripts/serve_gc_pauses.py serve solo/assets/solo-code-16m --port 8765 \
#     --max-queue-wait 0.1 &
#   solo bench --load chat --url http://127.0.0.1:8765 --rates 20 --duration 60 --verify 16 \
#     --json load-chat-20rps-gc-freeze.json --markdown load-chat-20rps-gc-freeze.md; kill -INT %1
# Session 4's end-of-session decode check.
run Qwen2.5-0.5B-bf16-session4-check $solo bench --shape Qwen2.5-0.5B --gen-len 64 --repeats 3 --energy-s 0 \
  --json Qwen2.5-0.5B-bf16-session4-check.json

# Session 5: the engines in turns of 16 decode tokens within each run, a bandwidth probe between every two turns.
run Qwen2.5-0.5B-bf16-lockstep $solo bench --shape Qwen2.5-0.5B --gen-len 256 --repeats 3 --energy-s 0 \
  --compare llama.cpp --lockstep 16 --json Qwen2.5-0.5B-bf16-lockstep.json
run Llama-3.2-1B-bf16-lockstep $solo bench --shape Llama-3.2-1B --gen-len 256 --repeats 3 --energy-s 0 \
  --compare llama.cpp --lockstep 16 --json Llama-3.2-1B-bf16-lockstep.json
run Qwen2.5-0.5B-long-context-lockstep $solo bench --shape Qwen2.5-0.5B --gen-len 2 --repeats 1 --energy-s 0 \
  --sweep-context --contexts 128,1024,4096,8192,16384,32638 --sweep-fill random --sweep-gen-len 129 \
  --lockstep 16 --json Qwen2.5-0.5B-long-context-lockstep.json --plot Qwen2.5-0.5B-long-context-lockstep.png
# MoE shapes that fit beside two llama.cpp copies (the models' layer shapes, fewer layers), in turns.
run OLMoE-1B-7B-4L-bf16-lockstep $solo bench --shape OLMoE-1B-7B-4L --gen-len 256 --repeats 3 --energy-s 0 \
  --compare llama.cpp --lockstep 16 --json OLMoE-1B-7B-4L-bf16-lockstep.json
run Qwen3-30B-A3B-2L-bf16-lockstep $solo bench --shape Qwen3-30B-A3B-2L --gen-len 256 --repeats 3 --energy-s 0 \
  --compare llama.cpp --lockstep 16 --json Qwen3-30B-A3B-2L-bf16-lockstep.json
# The AVX2 kernels against the AVX2-only llama.cpp build, in turns; before and after the weight prefetch on Zen 5
# (the "before" run on the commit before it).
for name in Qwen2.5-0.5B-bf16-avx2-proxy-lockstep Qwen2.5-0.5B-bf16-avx2-proxy-lockstep-prefetch; do
  run "$name" env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" \
    $solo bench --shape Qwen2.5-0.5B --gen-len 256 --repeats 3 --energy-s 0 "${avx2_peer[@]}" --lockstep 16 \
    --json "$name.json"
done
run Llama-3.2-1B-bf16-avx2-proxy-lockstep-prefetch env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
  LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" $solo bench --shape Llama-3.2-1B --gen-len 256 --repeats 3 \
  --energy-s 0 "${avx2_peer[@]}" --lockstep 16 --json Llama-3.2-1B-bf16-avx2-proxy-lockstep-prefetch.json
# Whole decode steps with and without the weight prefetch (DIR: a copy of solo/runtime/cpu_kernels whose
# common.h starts with `#undef SOLO_NO_SW_PREFETCH`), from the repository root, on the commit before it:
#   [SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2] python benchmarks/step_ab.py --shape S [--quantize int8] \
#     --steps 16 --rounds 10 --variant base= --variant t0=lib:DIR
# The AVX512-BF16 kernels in turns again after the prefetch change.
run Qwen2.5-0.5B-bf16-lockstep-prefetch $solo bench --shape Qwen2.5-0.5B --gen-len 256 --repeats 3 --energy-s 0 \
  --compare llama.cpp --lockstep 16 --json Qwen2.5-0.5B-bf16-lockstep-prefetch.json
run Llama-3.2-1B-bf16-lockstep-prefetch $solo bench --shape Llama-3.2-1B --gen-len 256 --repeats 3 --energy-s 0 \
  --compare llama.cpp --lockstep 16 --json Llama-3.2-1B-bf16-lockstep-prefetch.json
# Session 6. The full OLMoE-1B-7B in int8 against llama.cpp's Q8_0 in turns (the quantized run frees its dense
# model once the GGUF is written, so both fit in 24 GiB).
run OLMoE-1B-7B-int8-lockstep $solo bench --shape OLMoE-1B-7B --quantize int8 --prompt-len 32 --gen-len 256 \
  --repeats 3 --lockstep 16 --energy-s 0 --compare llama.cpp --json OLMoE-1B-7B-int8-lockstep.json
# TTFT after the last layer runs for the last position only, the cost-balanced attention split and the
# governor's span rule: the AVX2 proxy at 128 and 512 tokens, then the AVX512-BF16 kernels at 128.
for p in 128 512; do
  for shape in Qwen2.5-0.5B Llama-3.2-1B; do
    run "$shape-ttft$p-avx2-proxy-session6" env SOLO_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
      LLAMA_CPP_LIB_PATH="${LLAMA_CPP_AVX2_LIB:-}" $solo bench --shape "$shape" --prompt-len $p --gen-len 16 \
      --repeats 5 --energy-s 0 "${avx2_peer[@]}" --json "$shape-ttft$p-avx2-proxy-session6.json"
  done
done
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-ttft128-session6" $solo bench --shape "$shape" --prompt-len 128 --gen-len 16 --repeats 5 \
    --energy-s 0 --compare llama.cpp --json "$shape-ttft128-session6.json"
done
# Same-process A/Bs of the span prefill (from the repository root; DIR = solo/runtime/cpu_kernels of the
# commit before the change):
#   SOLO_CPU_ISA=avx2 python benchmarks/prefill_ab.py --shape Llama-3.2-1B --prompt-len 128 --rounds 6 \
#     --variant before=lib:DIR --variant after=
