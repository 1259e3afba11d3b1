#!/usr/bin/env bash
# One replica's serving capacity, repeated: where it goes and whether it holds. Usage (repository root):
#   OUT=DIR bash tools/device/serve_capacity.sh
# REPEATS (default 3) rounds, each a fresh `parbench serve` of one replica under round-robin and then
# under dynamic batching (policy batch), offered RATE req/s (default 800, above one replica's
# unbatched capacity) for DURATION s (default 2); WL (default gpt-small) scoring prompts of 16-96
# tokens. Prints per run its answered rate, capacity (bench.serve.limit), what limits it, the gap
# between batches, the forward and NVML's GPU utilisation, then each policy's capacity spread.
# Into $OUT: serve_capacity.csv and the runs' logs.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-serve-capacity}; R=/tmp/pb-serve-capacity; mkdir -p "$OUT" "$R"
DEV=cuda; python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || DEV=cpu
for i in $(seq 1 "${REPEATS:-3}"); do
  for policy in round-robin batch; do
    timeout 200 python3 -m bench serve --device "$DEV" --workload "${WL:-gpt-small}" --world-sizes 1 \
      --placements replicas --policies "$policy" --rates "${RATE:-800}" --duration "${DURATION:-2}" \
      --size uniform --size-min 16 --size-max 96 --sample-hz 20 --cell-timeout 120 --out "$R/$i-$policy" \
      > "$OUT/serve-$i-$policy.log" 2>&1 || echo "run $i $policy: exit $?" >&2
  done
done
python3 - "$R" "$OUT/serve_capacity.csv" <<'PY'
import glob, sys
import pandas as pd
from bench.results.run import load_run
rows = []
ms = lambda v: float(v) * 1e3 if v is not None and pd.notna(v) else float("nan")
for d in sorted(glob.glob(sys.argv[1] + "/*/*/cells.parquet")):
    c = load_run(d[:-len("/cells.parquet")])[0]
    for r in c.itertuples():
        rows.append({"repeat": d.split("/")[-3].split("-")[0], "policy": r.serve_policy, "status": r.status,
                     "achieved_rps": r.serve_achieved_rps, "capacity_rps": getattr(r, "serve_capacity_rps", None),
                     "limited_by": getattr(r, "serve_limit_kind", None),
                     "gap_ms": ms(getattr(r, "serve_gap_mean_s", None)),
                     "forward_ms": r.service_mean_s * 1e3, "batch_mean": r.serve_batch_mean,
                     "gpu_util_pct": getattr(r, "gpu_util_mean", None), "p50_ms": r.latency_p50_s * 1e3})
t = pd.DataFrame(rows)
t.to_csv(sys.argv[2], index=False)
pd.set_option("display.width", 200)
print(t.round(2).to_string(index=False))
for pol, g in t.groupby("policy"):
    cap = g["capacity_rps"].astype(float)
    print(f"{pol}: capacity {cap.min():.0f}-{cap.max():.0f} req/s over {len(g)} runs, spread {cap.max() / cap.min() - 1:.1%}")
PY
