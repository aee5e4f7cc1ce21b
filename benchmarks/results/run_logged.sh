# Sourced by the per-CPU benchmark scripts (*/run.sh): run NAME CMD... runs CMD with its output in NAME.txt,
# which starts with the command and its start time and ends with its exit status and end time.
run() {
  local name=$1; shift
  { echo "+ $*"; echo "# $(date -u +%T) UTC start"; } > "$name.txt"
  "$@" >> "$name.txt" 2>&1
  echo "# $(date -u +%T) UTC exit $?" >> "$name.txt"
}
