#!/usr/bin/env bash
# One-shot GPU check of Solo's CUDA decode path: benchmarks, parity tests, kernel bandwidth, peers.
#
#   bash scripts/device_check.sh OUT_DIR          (from the repository root; about 7.5 minutes on an H200)
#
# Needs python3 with torch, triton and transformers; installs nothing and needs no network or server
# packages. Every step runs under `timeout`, logs to OUT_DIR/<step>.log, appends its exit status and
# duration to OUT_DIR/steps.jsonl and never stops the script. Each step's limit is also capped by what
# is left of the total budget (SOLO_CHECK_BUDGET_S, default 450 s), so the whole run ends in time
# even when steps hang. The steps, in order of value, with their expected durations on an H200:
#
#   env           ~5 s    GPU, driver, versions                                         (limit 20 s)
#   solo_llama    ~65 s   Llama-3.2-1B shape, Solo engines: tunes + compiles the kernels,
#                         captures the graphs, times block/PDL/token/torch modes        (limit 100 s)
#   mk_llama      ~170 s  Llama-3.2-1B shape in ONE run (one HBM probe / roofline): the monokernel
#                         (256 tokens per launch, and one per launch), the CUDA-graph path
#                         (triton:block:16) and transformers static cache + torch.compile  (limit 200 s)
#   mk_pytest     ~60 s   monokernel GPU parity (tests/runtime/test_megakernel_gpu.py)  (limit 100 s)
#   solo_lane     ~80 s   Laneformer-2B-dense shape, the same engines + the monokernel       (limit 110 s)
#   pytest_gpu    ~100 s  GPU parity tests (pytest -m gpu, per-test timeouts)           (limit 150 s)
#   kernels       ~40 s   achieved GB/s of every kernel for both shapes + HBM probe
#                         (launch configurations come from the tuning cache)            (limit 80 s)
#   hf_llama      ~100 s  transformers, static cache + torch.compile(reduce-overhead)   (limit 130 s)
#   hf_lane       ~100 s  the same, Laneformer-2B-dense shape                             (limit 130 s)
#   summary       ~2 s    scripts/device_summary.py -> OUT_DIR/results.json            (limit 30 s)
#   extras        rest    only with budget left: kernel tests compiled on the GPU, the
#                         torch.compile'd step, K=8/32 blocks, PDL released early vs late (the default),
#                         energy per token (solo bench over
#                         NVML with nvidia-ml-py; "not measurable here" without it)
# Expected total above the budget: the budget cap keeps it under 8 minutes whatever happens, cutting
# the last steps (hf_lane, extras) first. The separate hf_llama step is gone: mk_llama times
# transformers in the same run as Solo's engines.
# SOLO_CHECK_PROFILE=short runs a ~6-minute subset (headline benchmarks with the monokernel, parity
# subsets, kernels, energy).
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
BUDGET=${SOLO_CHECK_BUDGET_S:-450}
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

# The merged results are written even when the budget is spent (at most 20 s past it).
final_summary() {
    timeout -k 5 20 $PY scripts/device_summary.py "$OUT" > "$OUT/summary_final.log" 2>&1
    cat "$OUT/summary_final.log"
    echo "total $(($(date +%s) - START))s; results in $OUT/results.json"
}

step env 20 bash -c "nvidia-smi; $PY -c 'import torch, triton, transformers, sys; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name()); \
print(\"triton\", triton.__version__, \"transformers\", transformers.__version__)'"

BENCH="$PY -m solo.runtime.cuda.bench --prompt-len 128 --gen-len 256 --repeats 3"
MK_ENGINES=megakernel:block:256
if [ "${SOLO_CHECK_PROFILE:-full}" = short ]; then
    # A device session with ~6 minutes left: the headline numbers first (the monokernel, the CUDA-graph
    # path and transformers in one run), then parity subsets.
    step mk_llama 170 $BENCH --shape Llama-3.2-1B --engines $MK_ENGINES,triton:block:16,triton-pdl:block:16 \
        --with-peer hf-compile --json "$OUT/bench_llama_mk.json"
    step mk_pytest 60 $PY -m pytest -q -p no:cacheprovider -m gpu --timeout 120 \
        -k "teacher or greedy_tokens or llama_1b" --junitxml "$OUT/pytest_mk.xml" tests/runtime/test_megakernel_gpu.py
    step pytest_gpu 70 $PY -m pytest -q -p no:cacheprovider -m gpu --timeout 60 \
        -k "(greedy and triton) or host_syncs or engine_runs or split_k" \
        --junitxml "$OUT/pytest_gpu.xml" tests/runtime/test_cuda_gpu.py
    step solo_lane 60 $BENCH --shape Laneformer-2B-dense --engines triton:block:16,$MK_ENGINES \
        --json "$OUT/bench_lane_solo.json"
    step summary 20 $PY scripts/device_summary.py "$OUT"
    step kernels 40 $PY -m solo.runtime.triton.benchtools --json "$OUT/kernels.json"
    step energy 60 $PY -m solo.cli bench --shape Llama-3.2-1B --device cuda --prompt-len 128 --gen-len 256 \
        --repeats 1 --probe-gib 1 --energy-s 10 --json "$OUT/bench_energy.json"
    final_summary
    exit 0
fi
ENGINES=triton:block:16,triton-pdl:block:16,triton:token,torch:block:16
step solo_llama 100 $BENCH --shape Llama-3.2-1B --engines $ENGINES \
    --json "$OUT/bench_llama_solo.json"
step mk_llama 200 $BENCH --shape Llama-3.2-1B --engines $MK_ENGINES,megakernel:token,triton:block:16 \
    --with-peer hf-compile --json "$OUT/bench_llama_mk.json"
step mk_pytest 100 $PY -m pytest -q -p no:cacheprovider -m gpu --timeout 300 \
    --junitxml "$OUT/pytest_mk.xml" tests/runtime/test_megakernel_gpu.py
step solo_lane 110 $BENCH --shape Laneformer-2B-dense --engines $ENGINES,$MK_ENGINES \
    --json "$OUT/bench_lane_solo.json"

step pytest_gpu 150 $PY -m pytest -q -p no:cacheprovider -m gpu --timeout 180 \
    --junitxml "$OUT/pytest_gpu.xml" tests/runtime/test_cuda_gpu.py

step kernels 80 $PY -m solo.runtime.triton.benchtools --json "$OUT/kernels.json"

step hf_lane 130 $BENCH --shape Laneformer-2B-dense --peer hf-compile --json "$OUT/bench_lane_hf.json"

step summary 30 $PY scripts/device_summary.py "$OUT"

# Extras, only while budget is left (each capped by it): kernel tests compiled on the GPU, the
# torch.compile'd step and other block sizes.
step pytest_kern 60 $PY -m pytest -q -p no:cacheprovider --timeout 60 \
    --junitxml "$OUT/pytest_kern.xml" tests/runtime/test_triton_gemv.py tests/runtime/test_triton_qkv_rope.py \
    tests/runtime/test_triton_attention.py tests/runtime/test_triton_swiglu.py tests/runtime/test_triton_sampling.py \
    tests/runtime/test_cuda_runtime.py tests/runtime/test_cuda_block_loop.py
step extra_llama 120 $BENCH --shape Llama-3.2-1B --engines compiled:block:16,triton:block:8,triton:block:32 \
    --json "$OUT/bench_llama_extra.json"
# PDL release point: late (the default) against early, same shape (see common.pdl_mode).
step pdl_early 40 env SOLO_PDL_RELEASE=early $BENCH --shape Llama-3.2-1B --engines triton-pdl:block:16 \
    --json "$OUT/pdl_early_llama.json"  # not bench_*: same engine name as solo_llama
step energy 60 $PY -m solo.cli bench --shape Llama-3.2-1B --device cuda --prompt-len 128 --gen-len 256 \
    --repeats 1 --probe-gib 1 --energy-s 10 --json "$OUT/bench_energy.json"
final_summary
