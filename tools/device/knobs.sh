#!/usr/bin/env bash
# The training knobs on one GPU (gpt-200m, bf16). Usage (repository root):
#   OUT=DIR bash tools/device/knobs.sh PHASE [PHASE...]
#   memory   single-device peaks: AdamW vs SGD and checkpointing none/full/selective at global
#            batch 64, and compile with full checkpointing at 16 (one harness run; memory is not noise)
#   compile  the harness's eager and compiled AdamW cells against plain loops, interleaved in
#            KN_ROUNDS rounds (default 5) at global batch KN_GB (64), KN_STEPS (20) timed steps a side:
#            interleave.py families KN_FAM (default single-adamw,single-compile), within KN_DEADLINE s (560)
#   gpu      the GPU tests
# Results go to $OUT (logs, interleave.json, a cells table per run); a short table is printed last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-out}; R=/tmp/pb-results; mkdir -p "$OUT" "$R"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/gpus.csv"
cells() {  # the latest run under $R/$1 as $OUT/$1-cells.csv, and its short table
  python3 - "$(ls -d "$R/$1"/*/ | tail -n 1)" "$OUT/$1-cells.csv" <<'PY'
import sys
import pandas as pd
from bench.results.run import load_run
c = load_run(sys.argv[1])[0]
cols = [x for x in ["strategy", "world_size", "global_batch", "optimizer", "compile", "ac", "status",
        "step_time_median_s", "step_time_ci_low_s", "step_time_ci_high_s", "peak_mem_bytes", "compile_s",
        "compiled_graphs", "graph_breaks", "parity_rel_err", "precision_policy", "gpu_name", "reason"] if x in c]
c[cols].to_csv(sys.argv[2], index=False)
c = c[cols].copy()
for k in ("step_time_median_s", "step_time_ci_low_s", "step_time_ci_high_s"):
    c[k] = (c[k] * 1e3).round(2)
c["peak_mem_bytes"] = (c["peak_mem_bytes"] / 2**30).round(2)
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 60)
print(c.drop(columns=["gpu_name"]).to_string(index=False))
PY
}
for phase in "$@"; do
case "$phase" in
memory)
  for gb in 64 16; do
    extra=(--ac none,full,selective --optimizer adamw,sgd)
    [ "$gb" = 16 ] && extra=(--ac none,full --compile off,on)
    timeout 280 python3 -m bench run --no-progress --out "$R/mem$gb" --workloads gpt-200m --strategies single \
      --world-sizes 1 --global-batch "$gb" --steps 10 --warmup 3 --warmup-max 0 --steps-max 0 --budget off \
      --profile-steps 0 "${extra[@]}" > "$OUT/mem$gb.log" 2>&1 || tail -5 "$OUT/mem$gb.log"
    cells "mem$gb"
  done ;;
compile)
  timeout $(( ${KN_DEADLINE:-560} + 20 )) python3 tools/baselines/interleave.py --world-sizes 1 --families "${KN_FAM:-single-adamw,single-compile}" \
    --global-batch "${KN_GB:-64}" --repeats "${KN_ROUNDS:-5}" --steps "${KN_STEPS:-20}" --warmup 15 \
    --deadline-s "${KN_DEADLINE:-560}" --out "$R/il" > "$OUT/compile.log" 2>&1
  cp "$R/il/interleave.json" "$OUT/" 2>/dev/null
  tail -30 "$OUT/compile.log" ;;
gpu)
  timeout 240 python3 -m pytest -q tests/gpu 2>&1 | tail -5 ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
done
