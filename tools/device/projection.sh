#!/usr/bin/env bash
# On a machine with 4 GPUs: the projection check with a fixed model. A NCCL collective sweep at 2
# GPUs only (the model is fitted from 2-GPU data), a gpt-200m run of DDP, FSDP and tensor parallel
# with 5 repeats (the single-GPU reference, 2 and 4 GPUs; profiled steps on, so comm.parquet
# records the calls), then tools/projection_check.py: the 4-GPU step projected from the 1- and
# 2-GPU cells with the communication variant bench.comm.projection.fixed_variant picks from the
# 2-GPU cell, against each of the 5 repeats of the measured 4-GPU cell.
# About 5-6 minutes on 4 H100s (sweep ~1 min, run ~4 min).
# Usage (repository root): OUT=DIR bash tools/device/projection.sh
#   PJ_WS: the run's world sizes (default 2,4; the single-GPU reference cell is always planned at 1
#          GPU, and the projection reads no other 1-GPU cell; 1,2,4 adds DDP, FSDP and TP at 1 GPU,
#          about a minute more)
#   PJ_GB: the global batch (default: the workload's own, 16; the default GPU matrix runs 64)
# Into $OUT, flat (8 files): projection_check.{md,csv,json}, cells.parquet and steps.parquet (the
# run's, one file each, if < 2 MB), collectives.parquet (the sweep), inputs.tgz (the run and sweep
# folders without telemetry samples: rerun the check from them), projection.log. Each step's exit
# code is printed; the check's table is printed last.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-projection}
WS=${PJ_WS:-2,4}
R=/tmp/pb-projection
rm -rf "$R"
mkdir -p "$OUT" "$R"
LOG="$OUT/projection.log"
: > "$LOG"
t0=$SECONDS
RUN="" SWEEP="" sweep_rc=0 run_rc=0 check_rc=0

say() { echo "$*" | tee -a "$LOG"; }

step() {  # step NAME CMD...: CMD's output into the log; prints its exit code and time; returns the code
  local name=$1 t=$SECONDS rc=0
  shift
  "$@" >> "$LOG" 2>&1 || rc=$?
  say "[$name: exit $rc after $((SECONDS - t)) s]"
  return "$rc"
}

collect() {  # the small outputs into $OUT, flat; the table last
  local rc=$?
  set +e
  if [ -n "$SWEEP" ] && [ -f "$SWEEP" ]; then cp "$SWEEP" "$OUT/collectives.parquet"; fi
  if [ -n "$RUN" ] && [ -d "$RUN" ]; then
    python3 - "$RUN" "$OUT" >> "$LOG" 2>&1 <<'PY'
import sys
from pathlib import Path
from bench.results.store import read_table
run, out = Path(sys.argv[1]), Path(sys.argv[2])
for name in ("cells", "steps"):
    df = read_table(run, name)
    p = out / f"{name}.parquet"
    df.to_parquet(p, index=False)
    size = p.stat().st_size
    if size > 2 * 2**20:
        p.unlink()
        print(f"{name}.parquet: {size} bytes, over 2 MB: left out (it is in inputs.tgz)")
    else:
        print(f"{name}.parquet: {len(df)} rows, {size} bytes")
PY
  fi
  if [ -d "$R/run" ] || [ -d "$R/sweep" ]; then
    (cd "$R" && tar czf "$OUT/inputs.tgz" --exclude='samples.parquet' $(ls -d run sweep 2>/dev/null))
    if [ "$(stat -c %s "$OUT/inputs.tgz")" -gt $((15 * 2**20)) ]; then  # rank logs too large: tables only
      (cd "$R" && tar czf "$OUT/inputs.tgz" --exclude='samples.parquet' --exclude='work' $(ls -d run sweep 2>/dev/null))
    fi
  fi
  say "[steps: sweep exit $sweep_rc, run exit $run_rc, check exit $check_rc; total $((SECONDS - t0)) s; script exit $rc]"
  ls -la "$OUT"
  if [ -s "$OUT/projection_check.md" ]; then
    echo
    cat "$OUT/projection_check.md"
  else
    echo "no projection table; the log's last lines:"
    tail -n 40 "$LOG"
  fi
  exit "$rc"
}
trap collect EXIT

{
  nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv
  nvidia-smi topo -m || true
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" || true
} >> "$LOG" 2>&1
gpus=$(nvidia-smi -L | grep -c '^GPU' || true)
if [ "$gpus" -lt 4 ]; then
  say "this needs 4 GPUs; $gpus visible"
  exit 2
fi

# 1. The collective sweep at 2 GPUs: the ops DDP (all_reduce), FSDP (all_gather, reduce_scatter)
#    and TP (all_reduce) record, and broadcast; 1 KiB .. 1 GiB; fp32 and bf16 (pooled by the fit).
step sweep timeout 120 python3 -m bench comm --backends nccl --device cuda --world-sizes 2 \
  --ops all_reduce,all_gather,reduce_scatter,broadcast --dtypes fp32,bf16 --min-bytes 1K --max-bytes 1G --factor 2 \
  --iters 20 --warmup 5 --budget 0.1 --timeout 100 --out "$R/sweep" || sweep_rc=$?
SWEEP=$(ls "$R"/sweep/*/collectives.parquet 2>/dev/null | tail -n 1 || true)

# 2. The run: fixed step counts (no budget, no adaptive warm-up or steps), 5 repeats in Latin-square
#    rounds, 2 profiled steps per cell (the profile pass records comm.parquet and the compute split).
step run timeout 400 python3 -m bench run --no-progress --out "$R/run" --workloads gpt-200m \
  --strategies ddp,fsdp,tensor --backends nccl --world-sizes "$WS" --repeats 5 --steps 20 --warmup 5 \
  --warmup-max 0 --steps-max 0 --budget off --profile-steps 2 ${PJ_GB:+--global-batch "$PJ_GB"} || run_rc=$?
RUN=$(ls -d "$R"/run/*/ 2>/dev/null | tail -n 1 || true)
RUN=${RUN%/}

# 3. The check: the fixed variant's projection against each repeat of the 4-GPU cells.
if [ -z "$SWEEP" ] || [ -z "$RUN" ]; then
  say "no check: sweep table '${SWEEP}', run folder '${RUN}'"
  check_rc=2
else
  step check timeout 60 python3 -m tools.projection_check "$RUN" --sweep "$SWEEP" --out "$OUT" || check_rc=$?
fi
[ "$sweep_rc" -eq 0 ] && [ "$run_rc" -eq 0 ] && [ "$check_rc" -eq 0 ]
