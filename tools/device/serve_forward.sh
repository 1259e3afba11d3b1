#!/usr/bin/env bash
# Where one replica's serving capacity goes, on one GPU. Usage (repository root):
#   OUT=DIR bash tools/device/serve_forward.sh
# Prints the host's CPU and NUMA layout and the GPU's CPU affinity, then, in ROUNDS (default 3)
# interleaved rounds: the plain request loop (python -m tools.serve_forward, eager and CUDA graphs),
# each in a fresh process, and one `parbench serve` cell of one replica under round-robin at RATE
# req/s (default 800; a comma list for several levels), under --graphs GRAPHS (default auto); last, the
# eager loop confined to each NUMA node's cores. LOOP=0 leaves the plain loops out. Into $OUT:
# serve_forward.csv (the loops), serve-N.log and the serve runs' cells.csv.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-serve-forward}; R=/tmp/pb-serve-forward; mkdir -p "$OUT" "$R"
{ nproc; lscpu | grep -Ei 'model name|numa|socket|mhz'; nvidia-smi topo -m; } > "$OUT/host.txt" 2>&1
CSV=$OUT/serve_forward.csv; echo "round,cpuset,mode,pid,cpus,requests,wall_ms,wall_p90_ms,gpu_ms,capacity_rps" > "$CSV"
loop() {  # ROUND CPUSET [taskset args...]
  local r=$1 set=$2; shift 2
  "$@" python3 -m tools.serve_forward --modes "${MODES:-eager,graphs}" | sed "s/^/$r,$set,/" >> "$CSV"
}
for i in $(seq 1 "${ROUNDS:-3}"); do
  [ "${LOOP:-1}" = 0 ] || loop "$i" all
  timeout 150 python3 -m bench serve --workload "${WL:-gpt-small}" --world-sizes 1 --placements replicas \
    --policies round-robin --rates "${RATE:-800}" --duration 2 --size uniform --size-min 16 --size-max 96 \
    --sample-hz 20 --cell-timeout 120 --graphs "${GRAPHS:-auto}" --out "$R/$i" > "$OUT/serve-$i.log" 2>&1 || echo "serve $i: exit $?"
  grep -E "req/s|limited" "$OUT/serve-$i.log" | head -n 8
done
allowed=$(python3 -c "import os; print(sorted(os.sched_getaffinity(0)))")
for node in /sys/devices/system/node/node*; do
  cpus=$(python3 - "$node/cpulist" <<'PY'
import os, sys
def expand(s):
    out = set()
    for part in s.strip().split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out
mine = expand(open(sys.argv[1]).read()) & os.sched_getaffinity(0)
print(",".join(map(str, sorted(mine))))
PY
)
  [ -n "$cpus" ] && [ "${LOOP:-1}" != 0 ] && MODES=eager loop numa "$(basename "$node")" taskset -c "$cpus"
done
echo "allowed cpus: $allowed"
for d in "$R"/*/*/; do
  python3 -c "import pandas as pd, sys; pd.read_parquet(sys.argv[1] + 'cells.parquet').to_csv(sys.argv[2], index=False)" \
    "$d" "$OUT/serve-cells-$(basename "$(dirname "$d")").csv" 2>/dev/null
done
cat "$CSV"
