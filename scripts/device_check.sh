#!/usr/bin/env bash
# One-shot GPU check of Solo's CUDA decode path: benchmarks, parity tests, kernel bandwidth, peers.
#
#   bash scripts/device_check.sh OUT_DIR          (from the repository root; about 7.5 minutes on an H200)
#
# Needs python3 with torch, triton and transformers; installs nothing and needs no network or server
# packages. Every step runs under `timeout`, logs to OUT_DIR/<step>.log, appends its exit status and
# duration to OUT_DIR/steps.jsonl and never stops the script. Each step's limit is also capped by what
# is left of the total budget (SOLO_CHECK_BUDGET_S, default 470 s), so the whole run ends in time
# even when steps hang. The steps, in order of value, with their expected durations on an H200:
#
#   env           ~5 s    GPU, driver, versions                                         (limit 20 s)
#   solo_llama    ~65 s   Llama-3.2-1B shape, Solo engines: tunes + compiles the kernels,
#                         captures the graphs, times block/PDL/token/torch modes        (limit 100 s)
#   solo_lane     ~65 s   Laneformer-2B shape, the same                                 (limit 100 s)
#   pytest_gpu    ~100 s  GPU parity tests (pytest -m gpu, per-test timeouts)           (limit 150 s)
#   kernels       ~40 s   achieved GB/s of every kernel for both shapes + HBM probe
#                         (launch configurations come from the tuning cache)            (limit 80 s)
#   hf_llama      ~100 s  transformers, static cache + torch.compile(reduce-overhead)   (limit 130 s)
#   hf_lane       ~100 s  the same, Laneformer-2B shape                                 (limit 130 s)
#   summary       ~2 s    scripts/device_summary.py -> OUT_DIR/results.json            (limit 30 s)
#   extras        rest    only with budget left: kernel tests compiled on the GPU, the
#                         torch.compile'd step, K=8/32 blocks, energy per token (solo bench over
#                         NVML with nvidia-ml-py; "not measurable here" without it)
# Expected total ~470 s; the budget cap keeps it under 8 minutes whatever happens.
# SOLO_CHECK_PROFILE=short runs a ~5-minute subset (headline benchmarks, a parity subset, kernels).
set -u

OUT=${1:?usage: bash scripts/device_check.sh OUT_DIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SOLO_TUNING_CACHE="$OUT/triton_tuning.json"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/solo-triton-cache}"
export TOKENIZERS_PARALLELISM=false
unset TRITON_INTERPRET
PY=${PYTHON:-python3}
BUDGET=${SOLO_CHECK_BUDGET_S:-470}
START=$(date +%s)
: > "$OUT/steps.jsonl"

# step NAME LIMIT_S COMMAND... : run with a timeout capped by the remaining budget; never fails the script.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - ($(date +%s) - START)))
    if ((left < 15)); then
        echo "{\"step\": \"$name\", \"skipped\": \"budget\"}" >> "$OUT/steps.jsonl"
        echo "== $name: skipped (budget spent)"
        return 0
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit}s, $((BUDGET - left))s elapsed)"
    local t0
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local dt=$(($(date +%s) - t0))
    echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $dt, \"limit\": $limit}" >> "$OUT/steps.jsonl"
    echo "   rc=$rc in ${dt}s$([ $rc = 124 ] && echo ' (timed out)')"
    tail -n 4 "$OUT/$name.log" | sed 's/^/   | /'
    return 0
}

step env 20 bash -c "nvidia-smi; $PY -c 'import torch, triton, transformers, sys; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name()); \
print(\"triton\", triton.__version__, \"transformers\", transformers.__version__)'"

BENCH="$PY -m solo.runtime.cuda.bench --prompt-len 128 --gen-len 256 --repeats 3"
if [ "${SOLO_CHECK_PROFILE:-full}" = short ]; then
    # A device session with ~5 minutes left: the headline numbers first, then a parity subset.
    step solo_llama 90 $BENCH --shape Llama-3.2-1B --engines triton:block:16,triton-pdl:block:16,torch:block:16 \
        --json "$OUT/bench_llama_solo.json"
    step hf_llama 110 $BENCH --shape Llama-3.2-1B --peer hf-compile --json "$OUT/bench_llama_hf.json"
    step pytest_gpu 70 $PY -m pytest -q -p no:cacheprovider -m gpu --timeout 60 \
        -k "(greedy and triton) or host_syncs or engine_runs or split_k" \
        --junitxml "$OUT/pytest_gpu.xml" tests/runtime/test_cuda_gpu.py
    step solo_lane 60 $BENCH --shape Laneformer-2B --engines triton:block:16,triton-pdl:block:16 \
        --json "$OUT/bench_lane_solo.json"
    step summary 20 $PY scripts/device_summary.py "$OUT"
    step kernels 40 $PY -m solo.runtime.triton.benchtools --json "$OUT/kernels.json"
    step energy 60 $PY -m solo.cli bench --shape Llama-3.2-1B --device cuda --prompt-len 128 --gen-len 256 \
        --repeats 1 --probe-gib 1 --energy-s 10 --json "$OUT/bench_energy.json"
    step summary_final 15 $PY scripts/device_summary.py "$OUT"
    echo "total $(($(date +%s) - START))s; results in $OUT/results.json"
    exit 0
fi
ENGINES=triton:block:16,triton-pdl:block:16,triton:token,torch:block:16
step solo_llama 100 $BENCH --shape Llama-3.2-1B --engines $ENGINES \
    --json "$OUT/bench_llama_solo.json"
step solo_lane 100 $BENCH --shape Laneformer-2B --engines $ENGINES \
    --json "$OUT/bench_lane_solo.json"

step pytest_gpu 150 $PY -m pytest -q -p no:cacheprovider -m gpu --timeout 180 \
    --junitxml "$OUT/pytest_gpu.xml" tests/runtime/test_cuda_gpu.py

step kernels 80 $PY -m solo.runtime.triton.benchtools --json "$OUT/kernels.json"

step hf_llama 130 $BENCH --shape Llama-3.2-1B --peer hf-compile --json "$OUT/bench_llama_hf.json"
step hf_lane 130 $BENCH --shape Laneformer-2B --peer hf-compile --json "$OUT/bench_lane_hf.json"

step summary 30 $PY scripts/device_summary.py "$OUT"

# Extras, only while budget is left (each capped by it): kernel tests compiled on the GPU, the
# torch.compile'd step and other block sizes.
step pytest_kern 60 $PY -m pytest -q -p no:cacheprovider --timeout 60 \
    --junitxml "$OUT/pytest_kern.xml" tests/runtime/test_triton_gemv.py tests/runtime/test_triton_qkv_rope.py \
    tests/runtime/test_triton_attention.py tests/runtime/test_triton_swiglu.py tests/runtime/test_triton_sampling.py \
    tests/runtime/test_cuda_runtime.py tests/runtime/test_cuda_block_loop.py
step extra_llama 120 $BENCH --shape Llama-3.2-1B --engines compiled:block:16,triton:block:8,triton:block:32 \
    --json "$OUT/bench_llama_extra.json"
step energy 60 $PY -m solo.cli bench --shape Llama-3.2-1B --device cuda --prompt-len 128 --gen-len 256 \
    --repeats 1 --probe-gib 1 --energy-s 10 --json "$OUT/bench_energy.json"
step summary_final 30 $PY scripts/device_summary.py "$OUT"
if [ -s "$OUT/summary_final.log" ]; then cat "$OUT/summary_final.log"; else cat "$OUT/summary.log"; fi
echo "total $(($(date +%s) - START))s; results in $OUT/results.json"
