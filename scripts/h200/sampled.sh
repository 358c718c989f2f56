# Sourced by the H200 scripts. `sampled NAME CMD...` runs CMD with its output in $LOGS/NAME.md
# while nvidia-smi samples the device's memory.used every 100 ms (the process's peak as a user
# sees it, context included); the largest sample goes to $LOGS/NAME.peak (MiB), and a line with
# the exit status and the peak to $LOGS/status.
sampled() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $LOGS/$name.smi &
  local smi=$!
  "$@" > $LOGS/$name.md 2>&1
  local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  sort -n $LOGS/$name.smi | tail -1 > $LOGS/$name.peak
  echo "$name exit $rc peak $(cat $LOGS/$name.peak) MiB at $(date -u +%T)" >> $LOGS/status
}
