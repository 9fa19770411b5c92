#!/usr/bin/env bash
# The node agent on a real NVIDIA GPU, end to end (issues: "NVML on a real GPU", #28).
#
#   bash bench/real_gpu.sh [PHASE_SECONDS]   # default 20 (a run of ~12 phases);
#   bash bench/real_gpu.sh envelope          # issue #45's checks (~4.5 min, real_gpu_envelope.py)
#                                            # results in $OUT or bench/real-gpu/
#
# Needs: an NVIDIA GPU and driver (nvidia-smi), Python >= 3.11 with PyTorch and
# nvidia-ml-py (a GPU node's usual image), and Vigil's `report` extra for the replay.
# Kafka is not needed: the agent writes its trace to a file. Runs from the source tree,
# installs nothing. REAL_GPU_SOURCES (default nvml,host), TRAIN_DEVICE (default
# cuda) and TRAIN_ARGS exist for a dry run of the script's plumbing on a machine without one.
#
# While a small transformer trains on GPU 0, paced as one rank of a synchronous job
# (bench/gpu_train.py: every step starts on a common period, half of it this rank's
# own work), it records, at the base interval:
#   - the agent's full-rate trace (`vigil agent --sources nvml,host --out`),
#   - `nvidia-smi --query-gpu` every second and `nvidia-smi dmon`,
# and makes real changes, one phase each (each logged with its exit status; one the
# machine refuses is skipped): SM clocks locked at 1,410 MHz (a throttle), the memory
# clock locked at its lowest (a stall at the same SM clock, where the GPU has more
# than one memory clock), warps spinning on every SM in every step (a stall: no bytes,
# no matrix work), memory-bound copies in every step (memory-bound work), a 20 %
# larger batch (more work), a lower power limit, a second process competing for the
# GPU, a pause of the training loop (REAL_GPU_PHASES picks some). Then it reports:
#   - every reading against nvidia-smi (units, scale, GPM availability, clocks-event reasons),
#   - µs per NVML call and the agent's CPU on the real driver,
#   - Moneo's adaptive sampling on the real trace (bench_sampling.py --trace),
#   - the detectors replaying it (health and link detections must be none),
# and leaves the trace compressed (trace.jsonl.gz, to commit as a fixture).
set -uo pipefail
cd "$(dirname "$0")/.."
P=${1:-20}  # seconds a phase
OUTDIR=${OUT:-bench/real-gpu}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ "${1:-}" = envelope ]; then  # issue #45's checks: bench/real_gpu_envelope.py
  nvidia-smi -q -d POWER,CLOCK,PERFORMANCE > "$OUTDIR/nvidia-smi-q.txt" 2>&1
  exec $PY bench/real_gpu_envelope.py run --out "$OUTDIR"
fi
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUTDIR/events.log"; }
SOURCES=${REAL_GPU_SOURCES:-nvml,host}
DEVICE=${TRAIN_DEVICE:-cuda}
TRAIN_ARGS=${TRAIN_ARGS:-}  # a smaller model for a dry run: --width 128 --layers 2 --seq 64
phase() { log "phase $1: $2"; }

nvidia-smi -L | tee "$OUTDIR/gpus.txt" || { echo "no NVIDIA GPU here"; exit 2; }
nvidia-smi -q > "$OUTDIR/nvidia-smi-q.txt"
$PY -c 'import torch, pynvml; print("torch", torch.__version__, "nvidia-ml-py", pynvml.__version__ if hasattr(pynvml, "__version__") else "?")' | tee -a "$OUTDIR/events.log"

log "NVML call cost"
$PY bench/real_gpu_check.py calls --ticks "${REAL_GPU_CALL_TICKS:-100}" > "$OUTDIR/nvml-calls.md" 2>&1
cat "$OUTDIR/nvml-calls.md"

nvidia-smi --query-gpu="$($PY -c 'from bench.real_gpu_check import SMI_QUERY; print(SMI_QUERY)')" \
  --format=csv,nounits -lms 1000 > "$OUTDIR/smi.csv" 2>&1 & SMI=$!
nvidia-smi dmon -s pucmt -o DT > "$OUTDIR/dmon.txt" 2>&1 & DMON=$!
$PY bench/gpu_train.py --device "$DEVICE" $TRAIN_ARGS --seconds 3600 > "$OUTDIR/train.log" 2>&1 & TRAIN=$!
VIGIL_AGENT_ADAPTIVE=false VIGIL_AGENT_ATTRIBUTION=static VIGIL_AGENT_JOB=real-gpu \
  VIGIL_AGENT_METRICS_PORT=0 VIGIL_AGENT_NODE="$(hostname)" \
  $PY -m vigil_gpu_monitor agent --sources "$SOURCES" --out "$OUTDIR/trace.jsonl" \
  > "$OUTDIR/agent.log" 2>&1 & AGENT=$!
log "started: train $TRAIN, agent $AGENT"
read -r PMIN PDEF < <(nvidia-smi -i 0 --query-gpu=power.min_limit,power.default_limit \
  --format=csv,noheader,nounits | tr -d ' ' | tr ',' ' ')
MCLKS=$(nvidia-smi -i 0 --query-supported-clocks=mem --format=csv,noheader,nounits \
  | tr -d ' ' | sort -n | uniq | tr '\n' ' ')
MCLK=${MCLKS%% *}
log "memory clocks supported: ${MCLKS:-?}; power limits: min ${PMIN:-?} W, default ${PDEF:-?} W"
smi() { nvidia-smi -i 0 "$@" >> "$OUTDIR/smi-set.log" 2>&1; echo $?; }
# the GPU's settings back as they were, however the run ends
restore() {
  nvidia-smi -i 0 -rgc >/dev/null 2>&1; nvidia-smi -i 0 -rmc >/dev/null 2>&1
  nvidia-smi -i 0 -rac >/dev/null 2>&1
  [ -n "${PDEF:-}" ] && nvidia-smi -i 0 -pl "${PDEF%.*}" >/dev/null 2>&1
  kill -CONT $TRAIN 2>/dev/null; kill $TRAIN 2>/dev/null
}
trap restore EXIT

# the agent's CPU over the run, from /proc (utime + stime, clock ticks)
cpu() { awk '{print $14 + $15}' "/proc/$AGENT/stat" 2>/dev/null || echo 0; }
for _ in $(seq 120); do grep -q calibrated "$OUTDIR/train.log" && break; sleep 1; done
grep calibrated "$OUTDIR/train.log" | tee -a "$OUTDIR/events.log"
C0=$(cpu); T0=$(date +%s.%N)
# one function a phase, each followed by a settling half phase
run_throttled() {
  phase throttled "lock SM clocks 1410 MHz: rc $(smi -lgc 1410,1410)"; sleep "$P"
  phase settle "unlock SM clocks: rc $(smi -rgc)"; sleep $((P / 2))
}
memclock() { nvidia-smi -i 0 --query-gpu=clocks.mem --format=csv,noheader,nounits | tr -d ' '; }
run_memory_clock() {
  # nvidia-smi answers rc 0 where the lock is not supported (an H100 wants the deferred
  # lock, which needs a GPU reset): the clock read back says whether it took. Where it
  # did not, application clocks (-ac memory,graphics: the highest graphics clock the
  # GPU lists at that memory clock, so the SM clock stays where it was) are tried.
  local rc how now gr
  rc=$(smi -lmc "${MCLK:-0}"); how="-lmc ${MCLK:-?}: rc $rc"; now=$(memclock)
  if [ "${now:-0}" != "${MCLK:-}" ] && [ -n "${MCLK:-}" ]; then
    gr=$(nvidia-smi -i 0 --query-supported-clocks=mem,gr --format=csv,noheader,nounits \
      | tr -d ' ' | awk -F, -v m="$MCLK" '$1 == m {print $2}' | sort -n | tail -1)
    how="$how, read back $now MHz; -ac $MCLK,${gr:-?}: rc $(smi -ac "$MCLK,${gr:-0}")"
    sleep 1; now=$(memclock)
  fi
  phase memory-clock "memory clock ${MCLK:-?} MHz ($how), now $now MHz"; sleep "$P"
  phase settle "memory clock back: rc $(smi -rmc) $(smi -rac), now $(memclock) MHz"
  sleep $((P / 2))
}
toggle() {  # phase name, signal, what
  phase "$1" "$3 ($2)"; kill -"$2" $TRAIN; sleep "$P"
  kill -"$2" $TRAIN; phase settle "$1 off"; sleep $((P / 2))
}
run_stall() { toggle stall WINCH "warps spinning on every SM in every step, no bytes"; }
run_memory_work() { toggle memory-work USR2 "memory-bound copies in every step"; }
run_more_work() { toggle more-work USR1 "batch +20 %"; }
run_power_cap() {
  phase power-cap "power limit ${PMIN:-?} W: rc $(smi -pl "${PMIN%.*}")"; sleep "$P"
  phase settle "power limit ${PDEF:-?} W: rc $(smi -pl "${PDEF%.*}")"; sleep $((P / 2))
}
run_competitor() {
  phase competitor "a second process's matrix products for ${P} s"
  $PY bench/gpu_train.py --compete --device "$DEVICE" $TRAIN_ARGS --seconds "$P" \
    >> "$OUTDIR/train.log" 2>&1
  phase settle "competitor ended"; sleep $((P / 2))
}
run_paused() {
  phase paused "training stopped (SIGSTOP)"; kill -STOP $TRAIN; sleep $((P / 2))
  kill -CONT $TRAIN; phase resumed "training resumed"; sleep $((P / 2))
}
phase baseline "paced training, nothing changed"; sleep "$P"
for name in ${REAL_GPU_PHASES:-throttled memory-clock stall memory-work more-work power-cap \
    competitor paused}; do
  "run_${name//-/_}"
done
C1=$(cpu); T1=$(date +%s.%N)
restore; wait $TRAIN 2>/dev/null
RSS=$(awk '/VmHWM/ {print $2}' "/proc/$AGENT/status" 2>/dev/null)
kill -TERM $AGENT; wait $AGENT; kill $SMI $DMON 2>/dev/null
HZ=$(getconf CLK_TCK)
log "agent: $(awk -v c="$((C1 - C0))" -v hz="$HZ" -v t0="$T0" -v t1="$T1" \
  'BEGIN {printf "%.2f %% of one core", 100 * c / hz / (t1 - t0)}'), peak RSS ${RSS:-?} kB"

{
  echo "# Vigil's agent on a real GPU, $(date -u +%Y-%m-%d)"; echo
  echo '```'; cat "$OUTDIR/gpus.txt" "$OUTDIR/events.log"; echo '```'; echo
  echo "## NVML calls"; echo; cat "$OUTDIR/nvml-calls.md"; echo
  echo "## Readings against nvidia-smi"; echo
  $PY bench/real_gpu_check.py compare "$OUTDIR/trace.jsonl" "$OUTDIR/smi.csv" "$OUTDIR/dmon.txt"
  echo; echo "## Adaptive sampling on the real trace"; echo; echo '```'
  $PY bench/bench_sampling.py --trace "$OUTDIR/trace.jsonl"
  echo '```'; echo; echo "## Detectors replaying the trace"; echo; echo '```'
  $PY -m vigil_gpu_monitor replay "$OUTDIR/trace.jsonl" --out "$OUTDIR/detections.jsonl"
  $PY - "$OUTDIR/detections.jsonl" <<'PYEOF'
import collections, json, sys
found = collections.Counter()
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["state"] == "firing":
        found[(d["kind"], d["summary"][:100])] += 1
print(f"{sum(found.values())} firing detections; health/link (must be 0):",
      sum(n for (k, _), n in found.items() if k in ("gpu_health", "link_health")))
for (kind, summary), n in found.most_common():
    print(f"  {n:4d}  {kind}: {summary}")
PYEOF
  echo '```'
  echo; echo "## Work against busy time (issue #28)"; echo; echo '```'
  $PY bench/real_gpu_check.py phases "$OUTDIR/events.log" "$OUTDIR/trace.jsonl" \
    "$OUTDIR/train.log"
  echo '```'
} > "$OUTDIR/summary.md" 2>&1
gzip -9 -c "$OUTDIR/trace.jsonl" > "$OUTDIR/trace.jsonl.gz"
rm -f "$OUTDIR/trace.jsonl"  # the compressed copy is what comes back and is committed
ls -la "$OUTDIR"; cat "$OUTDIR/summary.md"
