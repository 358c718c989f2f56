# Sourced by the H200 scripts after they set D (the log folder) and N (the bundle folder):
#   st WORDS...             a line in $D/summary.txt, with the time
#   run CRATE BINARY ARGS   a test binary of $N/tests from crates/CRATE with the GPU required,
#                           its log in $D/test-BINARY.log and its result line in the summary
#   peak LABEL CMD...       CMD with its output in $D/LABEL.out while nvidia-smi samples the
#                           process's used_memory every 50 ms; its peak (MiB) in the summary
#   wait_for FILE SECONDS   whether FILE appears within SECONDS
st() { echo "$* at $(date -u +%T)" >>"$D/summary.txt"; }
run() {
    local crate=$1 bin=$2
    shift 2
    local tests=$N/tests
    [[ $tests = /* ]] || tests=../../$tests
    (cd "crates/$crate" && HIPDECODE_REQUIRE_GPU=1 timeout 300 "$tests/$bin"-* "$@" \
        >"$D/test-$bin.log" 2>&1)
    st "$crate/$bin exit $? $(grep -h 'test result' "$D/test-$bin.log" | tail -1)"
}
peak() {
    local label=$1
    shift
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 50 \
        >"$D/$label.smi" 2>/dev/null &
    local sampler=$!
    "$@" >"$D/$label.out" 2>&1
    local rc=$?
    sleep 0.2
    kill $sampler
    local max
    max=$(awk -F, '{gsub(/ /, "", $2); if ($2 + 0 > m) m = $2 + 0} END {print m + 0}' \
        "$D/$label.smi")
    st "$label exit $rc nvidia-smi peak $max MiB"
}
wait_for() {
    for _ in $(seq 1 "$2"); do [ -f "$1" ] && return 0; sleep 1; done
    return 1
}
