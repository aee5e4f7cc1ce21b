# Sourced by the per-CPU benchmark scripts (*/run.sh): run NAME CMD... runs CMD with its output in NAME.txt,
# which starts with the command and its start time and ends with its exit status and end time; and the runs
# those sets share (below).
run() {
  local name=$1; shift
  { echo "+ $*"; echo "# $(date -u +%T) UTC start"; } > "$name.txt"
  "$@" >> "$name.txt" 2>&1
  echo "# $(date -u +%T) UTC exit $?" >> "$name.txt"
}

# The runs every CPU's set shares (issue #9's targets), with $solo as the caller sets it.
# TTFT at 512 tokens against llama.cpp's F16 and BF16 GGUFs.
ttft512_runs() {
  for shape in Qwen2.5-0.5B Llama-3.2-1B; do
    run "$shape-ttft512" $solo bench --shape "$shape" --prompt-len 512 --gen-len 16 --energy-s 0 \
      --compare llama.cpp --json "$shape-ttft512.json"
  done
}
# int8 against Q8_0, int4 against Q4_0 (128 generated).
quantized_runs() {
  for shape in Qwen2.5-0.5B Llama-3.2-1B; do
    for q in int8 int4; do
      run "$shape-$q" $solo bench --shape "$shape" --quantize $q --gen-len 128 --energy-s 0 --compare llama.cpp \
        --json "$shape-$q.json"
    done
  done
}
# Beside one busy-loop process (one of the two cores taken by other work).
cpu_hog_run() {
  run Qwen2.5-0.5B-bf16-cpu-hog $solo bench --shape Qwen2.5-0.5B --gen-len 64 --energy-s 0 --cpu-hog 1 \
    --compare llama.cpp --json Qwen2.5-0.5B-bf16-cpu-hog.json
}
