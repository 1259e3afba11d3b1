#!/usr/bin/env bash
# On a 4-GPU machine: the collective sweep at world sizes 2 and 4 on NCCL (1 KiB .. 1 GiB)
# and Gloo with CUDA tensors (1 KiB .. 64 MiB), the plain torch all_reduce loop, a small CUDA-graph
# sweep of the small sizes, the alpha-beta fit, the projection check against a recorded multi-GPU
# run (RUN) and that run's recorded calls against the curve. About 5 minutes on 4 H100s.
# Usage (repository root): OUT=/some/dir bash tools/device/device_comm.sh RUN
# RUN: a recorded multi-GPU run folder (results/<run-id> with cells.parquet and comm.parquet, its
# single-device and 2-GPU cells) for the projection check and the recorded calls against the curve.
# Into $OUT (7 files): collectives.parquet, meta.json, comm_model.csv, comm_vs_curve.csv,
# projection.csv, projection.png, device_comm.log. The short tables are printed last.
set -uo pipefail
RUN=${1:-${RUN:-}}
if [ -z "$RUN" ] || [ ! -e "$RUN/cells.parquet" ]; then
  echo "usage: OUT=DIR bash tools/device/device_comm.sh RUN (a recorded multi-GPU run folder with cells.parquet)" >&2
  exit 2
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-comm}; R=/tmp/pb-comm; rm -rf "$R"; mkdir -p "$OUT" "$R"
LOG="$OUT/device_comm.log"
{
  nvidia-smi --query-gpu=index,name,driver_version --format=csv
  nvidia-smi topo -m 2>/dev/null || true
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
} > "$LOG" 2>&1
comm() { timeout "$1" python3 -m bench comm "${@:2}" >> "$LOG" 2>&1; echo "[exit $? after: ${*:2}]" >> "$LOG"; }
t0=$SECONDS
# 1. NCCL, eager back-to-back (the numbers), with the plain loop at 1 GiB in the same groups.
comm 330 --backends nccl --device cuda --world-sizes 2,4 --min-bytes 1K --max-bytes 1G --factor 2 \
     --iters 20 --warmup 5 --budget 0.1 --timeout 160 --out "$R/nccl"
# 2. Gloo with CUDA tensors: slow (~GB/s), so factor 4 and fewer calls.
comm 200 --backends gloo --device cuda --world-sizes 2,4 --min-bytes 1K --max-bytes 64M --factor 4 \
     --iters 5 --warmup 1 --budget 0.1 --timeout 95 --no-reference --out "$R/gloo"
# 3. NCCL small sizes replayed from a CUDA graph (launch cost removed): a separate run, so a
#    failing capture costs nothing above.
comm 100 --backends nccl --device cuda --world-sizes 2,4 --min-bytes 1K --max-bytes 1M --factor 4 \
     --ops all_reduce,all_gather,reduce_scatter,broadcast,all_to_all --dtypes bf16 --iters 100 --warmup 5 \
     --budget 0 --graph-max-bytes 1M --timeout 45 --no-reference --out "$R/graph"
echo "[sweeps took $((SECONDS - t0)) s]" >> "$LOG"
SWEEPS=$(ls "$R"/*/*/collectives.parquet 2>/dev/null)
python3 - "$OUT" $SWEEPS <<'PY' >> "$LOG" 2>&1
import shutil, sys, pandas as pd
from pathlib import Path
out, files = Path(sys.argv[1]), sys.argv[2:]
df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
df.to_parquet(out / "collectives.parquet", index=False)
nccl = [f for f in files if "/nccl/" in f]
if nccl:
    shutil.copy(Path(nccl[0]).parent / "meta.json", out / "meta.json")
from bench.comm.sweep import summary_table
print(summary_table(df[~df["graph"].fillna(False).astype(bool)]))
g = df[df["graph"].fillna(False).astype(bool)]
if len(g):
    print("\nCUDA-graph replay, small sizes (time per call, us):")
    print((g.pivot_table(index=["world_size", "op"], columns="bytes", values="time_s") * 1e6).round(1).to_string())
PY
python3 -m bench.comm.projection --sweep "$OUT/collectives.parquet" --run "$RUN" --out "$OUT" >> "$LOG" 2>&1
python3 -c "import json; t=json.load(open('$OUT/meta.json')).get('topology', {}); print(t.get('matrix') or t)" \
  >> "$LOG" 2>&1
echo "[total $((SECONDS - t0)) s]" >> "$LOG"
tail -n 120 "$LOG"
ls -la "$OUT"
