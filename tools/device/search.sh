#!/usr/bin/env bash
# The knob search on one GPU against an exhaustive grid over the same knobs. Usage (repository root):
#   OUT=DIR bash tools/device/search.sh PHASE [PHASE...]
#   default        the default run as `nox -s bench` runs it (parbench run --report), timed; its answer,
#                  best.toml, meta.json and cells go to $OUT/default/
#   grid-eager     gpt-200m at global batch 64, 128 and 256, checkpointing none, selective and full,
#   grid-compile   compile off (grid-eager) or on (grid-compile): 3 repeats a cell, interleaved in
#                  rounds; the memory model skips what cannot fit, as the search's does; cells to
#                  $OUT/grid-<phase>.parquet
#   top-C-AC-B,B   one corner of that grid (compile C, checkpointing AC, global batches B), within
#                  TOP_TIMEOUT s (default 250): the whole grid's compiled cells take more than one call;
#                  its files are named with _ for , ($OUT names may not hold commas)
# Each phase is one parbench run within SEARCH_TIMEOUT s (default 570); the check is
# `python -m tools.search_check` over the folders (run here, on the copies).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-out}; R=/tmp/pb-search; mkdir -p "$OUT" "$R"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpus.csv"
GRID="gpt-200m[global_batch=64],gpt-200m[global_batch=128],gpt-200m[global_batch=256]"
keep() {  # the run folder's small files, for the check
  local d; d=$(ls -d "$1"/*/ | tail -n 1); mkdir -p "$OUT/$2"
  for f in meta.json cells.parquet best.toml picks.json; do [ -f "$d/$f" ] && cp "$d/$f" "$OUT/$2/"; done
  python3 -c "import pandas as pd, sys; pd.read_parquet(sys.argv[1]).to_csv(sys.argv[2], index=False)" \
    "$d/cells.parquet" "$OUT/$2/cells.csv" || ls -la "$d"
}
for phase in "$@"; do
  t0=$(date +%s)
  case "$phase" in
  default)
    timeout "${SEARCH_TIMEOUT:-570}" python3 -m bench run --report --no-progress --out "$R/default" \
      > "$OUT/default.log" 2>&1; echo "rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/default.log"
    keep "$R/default" default; tail -n 12 "$OUT/default.log" ;;
  grid-eager|grid-compile)
    c=off; [ "$phase" = grid-compile ] && c=on
    timeout "${SEARCH_TIMEOUT:-570}" python3 -m bench run --no-progress --out "$R/$phase" --workloads "$GRID" \
      --strategies single --world-sizes 1 --compile "$c" --ac none,selective,full --repeats 3 --steps 5 \
      --warmup 3 --warmup-max 0 --steps-max 0 --profile-steps 0 --sample-hz 0 --search off \
      > "$OUT/$phase.log" 2>&1; echo "rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/$phase.log"
    keep "$R/$phase" "$phase"; tail -n 4 "$OUT/$phase.log" ;;
  top-*)  # one corner of the grid, 3 repeats a cell: top-COMPILE-AC-BATCH[,BATCH] (e.g. top-on-none-64,128)
    IFS=- read -r _ c ac gbs <<< "$phase"; wls=$(echo "$gbs" | sed 's/\([0-9]*\)/gpt-200m[global_batch=\1]/g')
    timeout "${TOP_TIMEOUT:-250}" python3 -m bench run --no-progress --out "$R/$phase" --workloads "$wls" \
      --strategies single --world-sizes 1 --compile "$c" --ac "$ac" --repeats 3 --steps 5 --warmup 3 --warmup-max 0 \
      --steps-max 0 --profile-steps 0 --sample-hz 0 --search off > "$OUT/${phase//,/_}.log" 2>&1
    echo "rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/${phase//,/_}.log"; keep "$R/$phase" "${phase//,/_}" ;;
  *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
