#!/usr/bin/env bash
# The CPU benchmark set of this folder (2-core Intel Xeon VM: AVX-512, AVX512-BF16, AVX512-FP16, AMX; 480 MiB
# L3): issue #9's targets on an AVX-512 CPU with a native llama.cpp build (AMX on). Run it on an otherwise
# idle machine (check `top` first); the runs go one after the other, each output file starting with its
# command and its start time. Peers: `CMAKE_ARGS="-DGGML_NATIVE=ON" pip install -e ".[llamacpp]"` builds
# llama.cpp for this CPU. Set STEP_AB to run the same-process A/Bs too (from a checkout: python is on PATH).
set -uo pipefail
cd "$(dirname "$0")"
solo="${SOLO:-solo}"
. ../run_logged.sh  # run NAME CMD... (output in NAME.txt); ttft512_runs, quantized_runs, cpu_hog_run

# Split-KV attention on AMX tiles (set ATTN_AMX to run only this part): attention at 32000 positions with
# the parts on tiles and on AVX-512 in one process, then the long-context sweep in turns (ATTN_AMX=ab: the
# A/Bs only).
if [ -n "${ATTN_AMX:-}" ]; then
  for shape in Qwen2.5-0.5B Llama-3.2-1B Qwen3-30B-A3B-2L; do  # head_dim 64, 64, 128
    run "attention-ab-amx-$shape-32000" python ../../attention_ab.py --shape "$shape" --context 32000 --steps 8 \
      --rounds 5 --fill random --variant avx512=attn_amx=0 --variant tiles=attn_amx=1
  done
  # Batched decode of 8 and 16 rows: products on tiles (the span path) against the packed decode kernel.
  for batch in 8 16; do
    run "batch-decode-ab-amx-$batch" python ../../batch_decode_ab.py --shape Qwen2.5-0.5B --batch "$batch" \
      --steps 8 --rounds 4 --variant tiles=amx=1 --variant decode-kernel=amx=0
  done
  [ "$ATTN_AMX" = ab ] && exit 0
  run Qwen2.5-0.5B-long-context-lockstep-amx-attn $solo bench --shape Qwen2.5-0.5B --gen-len 2 --repeats 1 \
    --energy-s 0 --sweep-context --contexts 128,1024,4096,8192,16384,32638 --sweep-fill random \
    --sweep-gen-len 129 --lockstep 16 --json Qwen2.5-0.5B-long-context-lockstep-amx-attn.json \
    --plot Qwen2.5-0.5B-long-context-lockstep-amx-attn.png
  exit 0
fi


# MoE (issue #14; set MOE to run only this part): the MoE layer shapes with fewer layers beside two llama.cpp
# copies, in turns of 16, the roofline counting the active bytes (as amd-epyc-zen5/run.sh).
if [ -n "${MOE:-}" ]; then
  for shape in OLMoE-1B-7B-4L Qwen3-30B-A3B-2L; do
    run "$shape-bf16-lockstep" $solo bench --shape "$shape" --gen-len 256 --repeats 3 --energy-s 0 \
      --compare llama.cpp --lockstep 16 --json "$shape-bf16-lockstep.json"
  done
  # The full OLMoE-1B-7B in int8 against Q8_0 (the quantized run frees its dense model before the peer loads).
  run OLMoE-1B-7B-int8-lockstep $solo bench --shape OLMoE-1B-7B --quantize int8 --prompt-len 32 --gen-len 256 \
    --repeats 3 --lockstep 16 --energy-s 0 --compare llama.cpp --json OLMoE-1B-7B-int8-lockstep.json
  exit 0
fi

# The AMX level (cpu_kernels/amx.h, the default on this CPU; set AMX to run only this part): whole decode steps
# of the packed kernel against the row-major AVX512-BF16 kernel in one process, TTFT and decode against
# llama.cpp, then the amx and avx512-bf16 levels in one window, alternating. The runs below this block
# predate the AMX level (they ran the avx512-bf16 kernels).
if [ -n "${AMX:-}" ]; then
  for shape in Qwen2.5-0.5B Llama-3.2-1B; do
    SOLO_CPU_ISA=amx run "step-ab-packed-$shape" python ../../step_ab.py --shape "$shape" --steps 8 --rounds 8 \
      --variant rowmajor=rowmajor --variant packed=
  done
  for shape in Qwen2.5-0.5B Llama-3.2-1B; do
    SOLO_CPU_ISA=amx run "$shape-ttft512-amx" $solo bench --shape "$shape" --prompt-len 512 --gen-len 16 \
      --energy-s 0 --compare llama.cpp --json "$shape-ttft512-amx.json"
    SOLO_CPU_ISA=amx run "$shape-bf16-amx" $solo bench --shape "$shape" --energy-s 0 \
      --compare llama.cpp,hf-eager --json "$shape-bf16-amx.json"
  done
  for isa in avx512-bf16 amx avx512-bf16 amx; do
    SOLO_CPU_ISA=$isa run "Qwen2.5-0.5B-levels-$isa-$(date +%H%M%S)" $solo bench --shape Qwen2.5-0.5B \
      --gen-len 128 --repeats 2 --energy-s 0
  done
  for isa in avx512-bf16 amx; do
    SOLO_CPU_ISA=$isa run "Llama-3.2-1B-levels-512-$isa" $solo bench --shape Llama-3.2-1B --prompt-len 512 \
      --gen-len 32 --energy-s 0
  done
  exit 0
fi

# The AVX512-BF16 decode kernel with 1, 2 and 4 row streams, whole decode steps in one process.
if [ -n "${STEP_AB:-}" ]; then
  for shape in Qwen2.5-0.5B Llama-3.2-1B; do
    run "step-ab-bf16-streams-$shape" python ../../step_ab.py --shape "$shape" --steps 8 --rounds 8 \
      --variant s1=bf16_streams=1 --variant s2=bf16_streams=2 --variant s4=bf16_streams=4
    run "step-ab-q8-streams-$shape" python ../../step_ab.py --shape "$shape" --quantize int8 --steps 8 --rounds 8 \
      --variant q1=q8_streams=1 --variant q2=q8_streams=2 --variant q4=q8_streams=4
    run "step-ab-int4-streams-$shape" python ../../step_ab.py --shape "$shape" --quantize int4 --steps 8 --rounds 8 \
      --variant z1=q8_streams=1 --variant z2=q8_streams=2
  done
fi
# bf16 decode (prompt 128, 256 generated) and TTFT at 128 against llama.cpp's F16 and BF16 GGUFs and
# transformers eager.
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-bf16" $solo bench --shape "$shape" --energy-s 0 --compare llama.cpp,hf-eager --json "$shape-bf16.json"
done
# TTFT at 512 tokens.
ttft512_runs
# In turns of 16 tokens (each turn against its own probes; each peer's turn paired with Solo's before it).
for shape in Qwen2.5-0.5B Llama-3.2-1B; do
  run "$shape-bf16-lockstep" $solo bench --shape "$shape" --energy-s 0 --compare llama.cpp --lockstep 16 \
    --json "$shape-bf16-lockstep.json"
done
# Phi-3-mini's shape against llama.cpp's F16 GGUF (a second, BF16 copy does not fit 24 GiB beside it).
run Phi-3-mini-bf16-lockstep $solo bench --shape Phi-3-mini --energy-s 0 --compare llama.cpp-F16 --lockstep 16 \
  --json Phi-3-mini-bf16-lockstep.json
# Gemma-3-1B's shape (per-layer RoPE tables) against llama.cpp's F16 and BF16 GGUFs, and the check that the
# bench's gemma3 GGUF is the same model (logits of a 6-layer copy in float32).
run Gemma-3-1B-bf16-lockstep $solo bench --shape Gemma-3-1B --energy-s 0 --compare llama.cpp --lockstep 16 \
  --json Gemma-3-1B-bf16-lockstep.json
run gguf-peer-logits-Gemma-3-1B python ../../gguf_peer_logits.py --shape Gemma-3-1B --layers 6 --prompt-len 700 \
  --type F32 --type F16 --type BF16
# SmolLM3-3B's shape (NoPE layers) against llama.cpp's F16 GGUF (two GGUF copies beside Solo do not fit 24 GiB).
run SmolLM3-3B-bf16-lockstep $solo bench --shape SmolLM3-3B --energy-s 0 --compare llama.cpp-F16 --lockstep 16 \
  --json SmolLM3-3B-bf16-lockstep.json
run gguf-peer-logits-SmolLM3-3B python ../../gguf_peer_logits.py --shape SmolLM3-3B --layers 8 \
  --type F32 --type F16 --type BF16
# The decode step after the engine's per-token path gained stop_reason (2026-12-05): Solo alone, in turns.
run Qwen2.5-0.5B-bf16-after-stop-reason $solo bench --shape Qwen2.5-0.5B --energy-s 0 --lockstep 16 \
  --json Qwen2.5-0.5B-bf16-after-stop-reason.json
# Phi-4-mini's shape (RoPE on 96 of each head's 128 dims) against llama.cpp's F16 GGUF, and the GGUF's logits.
run Phi-4-mini-bf16-lockstep $solo bench --shape Phi-4-mini --energy-s 0 --compare llama.cpp-F16 --lockstep 16 \
  --json Phi-4-mini-bf16-lockstep.json
run gguf-peer-logits-Phi-4-mini python ../../gguf_peer_logits.py --shape Phi-4-mini --layers 8 \
  --type F32 --type F16 --type BF16
# Beside one busy-loop process (one of the two cores taken by other work).
cpu_hog_run
# int8 against Q8_0, int4 against Q4_0: the native llama.cpp build's Q8_0 / Q4_0 (AMX) crashed on this VM,
# so these peers come from a build with AMX off (README.md).
quantized_runs
# Long context (#15): decode after a KV cache of random values up to the full context, in turns of 16 tokens.
run Qwen2.5-0.5B-long-context-lockstep $solo bench --shape Qwen2.5-0.5B --gen-len 2 --repeats 1 --energy-s 0 \
  --sweep-context --contexts 128,1024,4096,8192,16384,32638 --sweep-fill random --sweep-gen-len 129 --lockstep 16 \
  --json Qwen2.5-0.5B-long-context-lockstep.json --plot Qwen2.5-0.5B-long-context-lockstep.png

