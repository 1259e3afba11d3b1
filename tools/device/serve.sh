#!/usr/bin/env bash
# The serving benchmark on a 2- or 4-GPU machine. Each PART fits one 10-minute device call.
#   calib : closed loop (8 clients per GPU) on replicas/jsq, to find the capacity C the levels use
#   levels: every placement x policy at 0.3C, 0.6C and 0.9C, world sizes 2 and 4 (4 only if present)
#   sweep : MLPerf Server rate sweep (p99 target, >= 700 requests a point) for replicas jsq, shared, batch
#   noisy : a victim tenant alone and beside a bursty flood: replicas/jsq, pinned-tenants, dataparallel-infer
#   all   : calib, levels, sweep, noisy in one go (about 20 minutes: split it over calls)
# Usage (repository root): OUT=/some/dir bash tools/device/serve.sh calib   (first: the others read
# $OUT/capacity.txt), then ... levels, ... sweep, ... noisy, with the same OUT.
# levels over several calls: LV_WS=4 (one world size), LV_PLACEMENTS=pinned-tenants,pipeline (some
# placements), LV_TIMEOUT=400 (seconds a world size), LV_DURATION=12 (seconds of load a cell: a p99
# needs 662 requests, so at generation's 19-57 req/s about 12-35 s; the default 3 s gives p50s only).
# A new call's OUT is empty: write the capacity found by calib into $OUT/capacity.txt first.
# Into $OUT: one run folder per part (results tables), device_serve_<part>.log, capacity.txt, and after
# each part serve_tables.md (+ rate_vs_p99.png after the sweep) built over every run folder in $OUT, and
# serve-runs-<part>.tgz holding those run folders.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PART=${1:-levels}
case "$PART" in calib|levels|sweep|noisy|all) ;; *) echo "PART must be calib, levels, sweep, noisy or all" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/parbench-serve}; mkdir -p "$OUT"
WL=${WL:-gpt-small}; TASK=${TASK:-score}; GEN=${GEN:-16}  # TASK=generate: KV-cache decoding
NG=$(python3 -c "import torch; print(torch.cuda.device_count())")
WS=2; [ "$NG" -ge 4 ] && WS=2,4
WMAX=${WS##*,}
COMMON=(--device cuda --workload "$WL" --task "$TASK" --gen-tokens "$GEN" --size uniform --size-min 16
        --size-max 96 --sample-hz 10 --cell-timeout 240 --out "$OUT")
serve() { local log="$OUT/device_serve_$PART.log"; timeout "$1" python3 -m bench serve "${@:2}" >> "$log" 2>&1
          echo "[exit $? after: ${*:2}]" >> "$log"; }
capacity() {  # C: requests/s the closed loop achieved on $WMAX GPUs, per GPU x 2 (levels run at ws 2 and 4)
  [ -s "$OUT/capacity.txt" ] || python3 - "$OUT" <<'PY' > "$OUT/capacity.txt"
import sys, glob, pandas as pd
from bench.results.run import load_run
rows = []
for d in glob.glob(sys.argv[1] + "/*/cells.parquet"):
    c, _, _ = load_run(d[:-len("/cells.parquet")])
    c = c[(c["serve_load"].astype(str).str.startswith("closed")) & (c["status"] == "ok")]
    rows += [r.serve_achieved_rps / r.world_size for r in c.itertuples()]
print(f"{max(rows) if rows else 50.0:.1f}")
PY
  cat "$OUT/capacity.txt"
}
rates() { python3 -c "c=$1*$2; print(','.join(f'{c*f:.0f}' for f in ($3,)))"; }
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv; } > "$OUT/device_serve_$PART.log" 2>&1
t0=$SECONDS
case "$PART" in
  calib|all)
    serve 300 "${COMMON[@]}" --placements replicas --policies jsq,batch --world-sizes "$WMAX" \
      --clients $((8 * WMAX)) --duration 3 --requests 2000
    ;;&
  levels|all)
    C=$(capacity)  # per GPU; the total rate scales with the world size of each run below
    # LV_WS, LV_PLACEMENTS, LV_POLICIES, LV_TIMEOUT split the part over calls: with --task generate on 2 H100s the
    # replicas' five policies and DataParallel alone take the whole 280 s
    lv_ws=${LV_WS:-$WS}
    lv_pl=${LV_PLACEMENTS:-replicas,dataparallel-infer,pinned-tenants,pipeline}
    lv_pol=()  # policies balance replicas only (serve refuses them for a list without replicas)
    case ",$lv_pl," in *,replicas,*) lv_pol=(--policies "${LV_POLICIES:-round-robin,random,jsq,shared,batch}") ;; esac
    for ws in ${lv_ws//,/ }; do
      serve "${LV_TIMEOUT:-280}" "${COMMON[@]}" --placements "$lv_pl" \
        ${lv_pol[@]+"${lv_pol[@]}"} --world-sizes "$ws" \
        --rates "$(rates "$C" "$ws" "0.3,0.6,0.9")" --duration "${LV_DURATION:-3}"
    done
    ;;&
  sweep|all)
    C=$(capacity)
    # SW_POLICIES: the shared queue is in the default because it leads at 0.9 C on 4 H100s (docs/evidence/serve-h100-x4-warm.parquet)
    serve 560 "${COMMON[@]}" --placements replicas --policies "${SW_POLICIES:-jsq,shared,batch}" --world-sizes "$WMAX" \
      --rates "$(rates "$C" "$WMAX" "0.25")" --requests 700 --slo-ms "${SLO_MS:-100}" --duration 3
    ;;&
  noisy|all)
    C=$(capacity)
    serve 400 "${COMMON[@]}" --placements replicas,pinned-tenants,dataparallel-infer --policies jsq \
      --world-sizes 2 --rates "$(rates "$C" 2 "0.3")" --duration 4 --noisy \
      --noisy-rates "$(rates "$C" 1 "0.2,1.6")"
    ;;
esac  # (PART was checked above: a ';;&' arm falls through to the later patterns, so no '*)' arm here)
echo "[part $PART took $((SECONDS - t0)) s]" >> "$OUT/device_serve_$PART.log"
RUNS=$(ls -d "$OUT"/*/ 2>/dev/null | grep -v '/\.' )
[ -n "$RUNS" ] && python3 -m bench.serve.tables $RUNS --curve "$OUT/rate_vs_p99.png" > "$OUT/serve_tables.md" 2>&1
# the device tool brings back files at most two folders down, and a run folder's tables are folders of
# parquet parts (run/cells.parquet/part-*.parquet): the run folders travel as one archive
if [ -n "$RUNS" ]; then (cd "$OUT" && tar czf "serve-runs-$PART.tgz" $(for r in $RUNS; do basename "$r"; done)); fi
tail -n 60 "$OUT/device_serve_$PART.log"
cat "$OUT/serve_tables.md" 2>/dev/null | head -120
