#!/usr/bin/env bash
# The node agent on a real NVIDIA GPU, end to end (issue: "NVML on a real GPU").
#
#   bash bench/real_gpu.sh [SECONDS]        # default 600; results in $OUT or bench/real-gpu/
#
# Needs: an NVIDIA GPU and driver (nvidia-smi), Python >= 3.11 with PyTorch and
# nvidia-ml-py (a GPU node's usual image). Kafka is not needed: the agent writes its
# trace to a file. Runs from the source tree, installs nothing.
#
# While a small transformer trains on GPU 0, it records, at the base interval:
#   - the agent's full-rate trace (`vigil agent --sources nvml,host --out`),
#   - `nvidia-smi --query-gpu` every second and `nvidia-smi dmon`,
# and makes real changes on a schedule (each is logged with its exit status; one the
# machine refuses is skipped): a lower power limit, locked lower SM clocks, a second
# process competing for the GPU, a pause of the training loop, the memory clock locked
# low (a stall at the same SM clock) and a second process with a 20 % larger batch
# (more work). Then it reports:
#   - every reading against nvidia-smi (units, scale, GPM availability, clocks-event reasons),
#   - µs per NVML call and the agent's CPU on the real driver,
#   - Moneo's adaptive sampling on the real trace (bench_sampling.py --trace),
#   - the detectors replaying it (health and link detections must be none),
# and leaves the trace compressed (trace.jsonl.gz, to commit as a fixture).
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_TOTAL=${1:-600}
OUTDIR=${OUT:-bench/real-gpu}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUTDIR/events.log"; }
at() { sleep $(( $1 * SECONDS_TOTAL / 600 )); }   # schedule in tenths of a 600 s run

nvidia-smi -L | tee "$OUTDIR/gpus.txt" || { echo "no NVIDIA GPU here"; exit 2; }
nvidia-smi -q > "$OUTDIR/nvidia-smi-q.txt"
$PY -c 'import torch, pynvml; print("torch", torch.__version__, "nvidia-ml-py", pynvml.__version__ if hasattr(pynvml, "__version__") else "?")' | tee -a "$OUTDIR/events.log"

log "NVML call cost"
$PY bench/real_gpu_check.py calls --ticks 100 > "$OUTDIR/nvml-calls.md" 2>&1
cat "$OUTDIR/nvml-calls.md"

nvidia-smi --query-gpu="$($PY -c 'from bench.real_gpu_check import SMI_QUERY; print(SMI_QUERY)')" \
  --format=csv,nounits -lms 1000 > "$OUTDIR/smi.csv" 2>&1 & SMI=$!
nvidia-smi dmon -s pucmt -o DT > "$OUTDIR/dmon.txt" 2>&1 & DMON=$!
$PY bench/gpu_train.py --seconds "$SECONDS_TOTAL" > "$OUTDIR/train.log" 2>&1 & TRAIN=$!
VIGIL_AGENT_ADAPTIVE=false VIGIL_AGENT_ATTRIBUTION=static VIGIL_AGENT_JOB=real-gpu \
  VIGIL_AGENT_METRICS_PORT=0 VIGIL_AGENT_NODE="$(hostname)" \
  $PY -m vigil.cli agent --sources nvml,host --out "$OUTDIR/trace.jsonl" \
  > "$OUTDIR/agent.log" 2>&1 & AGENT=$!
log "started: train $TRAIN, agent $AGENT"
read -r PMIN PDEF < <(nvidia-smi -i 0 --query-gpu=power.min_limit,power.default_limit \
  --format=csv,noheader,nounits | tr -d ' ' | tr ',' ' ')

(
  at 120; log "power limit -> ${PMIN} W: rc $(nvidia-smi -i 0 -pl "${PMIN%.*}" >/dev/null 2>&1; echo $?)"
  at 120; log "power limit -> ${PDEF} W: rc $(nvidia-smi -i 0 -pl "${PDEF%.*}" >/dev/null 2>&1; echo $?)"
  at 30;  log "lock SM clocks 1000 MHz: rc $(nvidia-smi -i 0 -lgc 1000,1000 >/dev/null 2>&1; echo $?)"
  at 90;  log "unlock SM clocks: rc $(nvidia-smi -i 0 -rgc >/dev/null 2>&1; echo $?)"
  at 30;  log "competitor for $((SECONDS_TOTAL / 10)) s"
  $PY bench/gpu_train.py --compete --seconds $((SECONDS_TOTAL / 10)) >> "$OUTDIR/train.log" 2>&1
  at 30;  log "pause training"; kill -STOP $TRAIN
  at 30;  log "resume training"; kill -CONT $TRAIN
  # issue #28: a stall at the same SM clock (the memory clock lowered), then more work
  # (a second process with a 20 % larger batch): the work rate must tell them apart
  read -r MCLK < <(nvidia-smi -i 0 --query-supported-clocks=mem --format=csv,noheader,nounits \
    | tr -d ' ' | sort -n | head -1)
  at 30;  log "lock memory clock ${MCLK} MHz: rc $(nvidia-smi -i 0 -lmc "$MCLK" >/dev/null 2>&1; echo $?)"
  at 30;  log "unlock memory clock: rc $(nvidia-smi -i 0 -rmc >/dev/null 2>&1; echo $?)"
  at 10;  log "larger batch (+20 %) for $((SECONDS_TOTAL / 20)) s"
  $PY bench/gpu_train.py --batch 19 --seconds $((SECONDS_TOTAL / 20)) >> "$OUTDIR/train.log" 2>&1
) & SCHEDULE=$!

# the agent's CPU over the run, from /proc (utime + stime, clock ticks)
cpu() { awk '{print $14 + $15}' "/proc/$AGENT/stat" 2>/dev/null || echo 0; }
C0=$(cpu); T0=$(date +%s.%N)
wait $TRAIN
C1=$(cpu); T1=$(date +%s.%N)
kill $SCHEDULE 2>/dev/null; nvidia-smi -i 0 -rgc >/dev/null 2>&1; nvidia-smi -i 0 -rmc >/dev/null 2>&1; nvidia-smi -i 0 -pl "${PDEF%.*}" >/dev/null 2>&1
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
  $PY -m vigil.cli replay "$OUTDIR/trace.jsonl" --out "$OUTDIR/detections.jsonl"
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
  $PY bench/real_gpu_check.py phases "$OUTDIR/events.log" "$OUTDIR/trace.jsonl"
  echo '```'
} > "$OUTDIR/summary.md" 2>&1
gzip -9 -c "$OUTDIR/trace.jsonl" > "$OUTDIR/trace.jsonl.gz"
rm -f "$OUTDIR/trace.jsonl"  # the compressed copy is what comes back and is committed
ls -la "$OUTDIR"; cat "$OUTDIR/summary.md"
