#!/usr/bin/env bash
# On a machine with 4 GPUs: what the default run's decisions rest on, in parts that each fit a
# 10-minute call. Usage (repository root): OUT=DIR bash tools/device/decide.sh PART
#   check    gpt-200m and a nanoGPT-style GPT of the same size (tests.foreign_models:fused_gpt:
#            fused qkv, no biases) under ddp, allreduce-bucketed, fsdp, tensor and both one-loop
#            pipelines at 4 GPUs and the one-GPU reference, 3 repeats, 2 profiled steps, traces
#            kept, global batch CK_GB (default 64, the default run's); CK_STRATEGIES and
#            CK_REPEATS narrow it, CK_WORKLOADS (gpt-200m alone skips the kernel table) and CK_WS
#            (world sizes, default 4) move it. Tables: each cell's profiled step against its timed median (breakdown_gap), the
#            pipelines' bubble against the textbook and the stage model, and GPU time per kind of
#            kernel (tools/kernel_table.py) of both models at 1 and 4 GPUs. ~5 minutes.
#   gpipe    the harness's GPipe default against the plain GPipe loop, 5 interleaved rounds at 4
#            GPUs (tools/baselines/interleave.py). ~5 minutes.
#   profile  FSDP and DDP at 4 GPUs (global batch CK_GB, default 64), 2 repeats, CK_PROFILE (default
#            8) profiled steps, traces kept: how the profiled step compares with the timed one when
#            the window holds more steps; rank 0's timing-pass traces come back (cell<id>-rank0-gpu.json).
#   beyond   a model no single GPU holds: gpt-20b (BY_LAYERS layers, default 44: 20.3B parameters)
#            under single, ddp, fsdp, tensor and pipeline-1f1b at BY_WS GPUs (default 2), global
#            batch BY_GB (default 8), BY_REPEATS repeats (default 2) of 10 steps after 3 warm-up:
#            which cells ran out of memory, each cell's peak memory and step time, and the
#            recommendation. ~5 minutes.
#   default-start  `parbench run --report` exactly as `nox -s bench` runs it, in its own session
#            (it outlives the call; the device keeps such a process until the machine goes back),
#            output to /tmp/pb-default; waits up to DS_WAIT seconds (default 570) for it, and
#            brings back its tables, log and times when it ended within them.
#   default-wait   waits for a run still going to end, then brings back the same.
# Into $OUT, flat: the part's tables (.md, .csv, .parquet), its log; the table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-decide}
PART=${1:?part: check, profile, gpipe, beyond, default-start or default-wait}
mkdir -p "$OUT"
FUSED="tests.foreign_models:fused_gpt[vocab=16384,seq_len=1024,d_model=1024,n_head=16,n_layer=16]"
D=/tmp/pb-default

env_lines() {
  nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
}

# run_into LOG DIR LIMIT ARGS...: `parbench run ARGS` into DIR (emptied first), its output after the
# machine's lines in $OUT/LOG, stopped after LIMIT seconds; RUN is then its run folder.
run_into() {
  local log=$1 dir=$2 limit=$3 t=$SECONDS
  shift 3
  rm -rf "$dir"
  env_lines > "$OUT/$log" 2>&1
  timeout "$limit" python3 -m bench run --no-progress --out "$dir" "$@" >> "$OUT/$log" 2>&1
  echo "[run: exit $? after $((SECONDS - t)) s]" | tee -a "$OUT/$log"
  RUN=$(ls -d "$dir"/*/ | tail -n 1); RUN=${RUN%/}
}

# collect: the finished default run's log, meta and cells into $OUT, its wall time last.
collect() {
  local run
  run=$(ls -d "$D"/results/*/ | tail -n 1); run=${run%/}
  cp "$D/run.log" "$D/env.txt" "$OUT/"
  cp "$run/meta.json" "$OUT/meta.json"
  python3 - "$run" "$OUT" <<'PY'
import sys
from pathlib import Path
from bench.results.store import read_table
run, out = Path(sys.argv[1]), Path(sys.argv[2])
read_table(run, "cells").to_parquet(out / "cells.parquet", index=False)
PY
  python3 -c "s, e = map(float, open('$D/wall').read().split()); print(f'wall {e - s:.1f} s, exit', open('$D/rc').read().strip())" \
    | tee "$OUT/wall.txt"
  tail -n 60 "$D/run.log"
}

case "$PART" in
check)
  run_into check.log /tmp/pb-check 480 --workloads "${CK_WORKLOADS:-gpt-200m,$FUSED}" \
    --strategies "${CK_STRATEGIES:-ddp,allreduce-bucketed,fsdp,tensor,pipeline-gpipe,pipeline-1f1b}" --backends nccl \
    --world-sizes "${CK_WS:-4}" --global-batch "${CK_GB:-64}" --repeats "${CK_REPEATS:-3}" --budget off --profile-steps 2 --trace
  python3 - "$RUN" "$OUT" <<'PY' 2>&1 | tee -a "$OUT/check.log"
import sys
from pathlib import Path
import pandas as pd
from bench.results.store import read_table
run, out = Path(sys.argv[1]), Path(sys.argv[2])
c = read_table(run, "cells")
c.to_parquet(out / "cells.parquet", index=False)
c["workload"] = c["workload"].str.split("[", regex=False).str[0]
ok = c[c["status"] == "ok"].copy()
ok["timed ms"] = 1e3 * ok["step_time_median_s"]
ok["profiled ms"] = 1e3 * ok["profiled_step_s"]
ok["unprofiled ms"] = 1e3 * ok["unprofiled_step_s"] if "unprofiled_step_s" in ok else float("nan")
cols = ["workload", "strategy", "world_size", "repeats_done", "timed ms", "unprofiled ms", "profiled ms",
        "breakdown_gap", "idle_frac", "exposed_comm_s"]
cols = [k for k in cols if k in ok]
pipe = [k for k in ("bubble_theory", "bubble_stages", "bubble_measured", "pipeline_gap", "stage_blocks") if k in ok]
t = ok[cols + pipe].sort_values(["workload", "world_size", "strategy"])
t.to_csv(out / "check.csv", index=False)
print(t.to_markdown(index=False, floatfmt=".3f"))
bad = c[c["status"] != "ok"][["workload", "strategy", "world_size", "status", "reason"]]
if len(bad):
    print(bad.to_markdown(index=False))
print(f"cells ok {len(ok)}; |breakdown_gap| > 10%: {int((ok['breakdown_gap'].abs() > 0.10).sum())}")
PY
  [ -n "${CK_WORKLOADS:-}" ] || python3 -m tools.kernel_table "$RUN" --cell gpt-200m/single/1 --cell fused-gpt/single/1 --cell gpt-200m/ddp/4 \
    --cell fused-gpt/ddp/4 --json "$OUT/kernels.json" | tee "$OUT/kernels.md"
  ;;
profile)
  R=/tmp/pb-profile; rm -rf "$R"
  t=$SECONDS
  timeout 300 python3 -m bench run --no-progress --out "$R" --workloads gpt-200m --strategies fsdp,ddp \
    --backends nccl --world-sizes 4 --global-batch "${CK_GB:-64}" --repeats 2 --budget off \
    --profile-steps "${CK_PROFILE:-8}" --trace > "$OUT/profile.log" 2>&1
  echo "[run: exit $? after $((SECONDS - t)) s]" | tee -a "$OUT/profile.log"
  RUN=$(ls -d "$R"/*/ | tail -n 1); RUN=${RUN%/}
  for f in $(find "$RUN" -name 'cell*-rank0-gpu.json'); do cp "$f" "$OUT/"; done
  python3 - "$RUN" "$OUT" <<'PY' 2>&1 | tee -a "$OUT/profile.log"
import sys
from pathlib import Path
from bench.results.store import read_table
run, out = Path(sys.argv[1]), Path(sys.argv[2])
c = read_table(run, "cells")
c.to_parquet(out / "cells.parquet", index=False)
read_table(run, "steps").to_parquet(out / "steps.parquet", index=False)
ok = c[c["status"] == "ok"]
cols = ["cell_id", "strategy", "world_size", "step_time_median_s", "step_time_cv", "profiled_step_s", "breakdown_gap",
        "idle_frac", "exposed_comm_s"]
print(ok[cols].to_markdown(index=False, floatfmt=".4f"))
PY
  ;;
gpipe)
  t=$SECONDS
  timeout 580 python3 tools/baselines/interleave.py --families pipeline-gpipe --world-sizes 4 --repeats 5 \
    --deadline-s 540 > "$OUT/gpipe.log" 2>&1
  echo "[interleave: exit $? after $((SECONDS - t)) s]" | tee -a "$OUT/gpipe.log"
  rm -rf "$OUT/interleave-runs"
  tail -n 25 "$OUT/gpipe.log"
  ;;
beyond)
  run_into beyond.log /tmp/pb-beyond 540 --workloads "gpt-20b[n_layer=${BY_LAYERS:-44}]" \
    --strategies single,ddp,fsdp,tensor,pipeline-1f1b --backends nccl --world-sizes "${BY_WS:-2}" \
    --global-batch "${BY_GB:-8}" --repeats "${BY_REPEATS:-2}" --steps 10 --warmup 3 --budget off
  python3 - "$RUN" "$OUT" <<'PY' 2>&1 | tee -a "$OUT/beyond.log"
import sys
from pathlib import Path
from bench.results.store import read_table
run, out = Path(sys.argv[1]), Path(sys.argv[2])
c = read_table(run, "cells")
c.to_parquet(out / "cells.parquet", index=False)
c["ms"] = 1e3 * c["step_time_median_s"]
c["peak GiB"] = c["peak_mem_bytes"] / 2**30
c["reason"] = c["reason"].fillna("").str.slice(0, 60)
cols = ["strategy", "world_size", "status", "repeats_done", "ms", "step_time_cv", "peak GiB", "breakdown_gap", "reason"]
print(c[[k for k in cols if k in c]].to_markdown(index=False, floatfmt=".3f"))
PY
  sed -n '/^recommendation/,$p' "$OUT/beyond.log" | head -n 20
  ;;
default-start)
  rm -rf "$D"; mkdir -p "$D"
  env_lines > "$D/env.txt" 2>&1
  # The run outlives this call: its own session, its wall time and exit code written beside it.
  setsid bash -c "cd '$PWD'; s=\$(date +%s.%N); python3 -m bench run --report --out '$D/results' > '$D/run.log' 2>&1; \
    echo \$? > '$D/rc'; e=\$(date +%s.%N); echo \"\$s \$e\" > '$D/wall'" < /dev/null > /dev/null 2>&1 &
  for _ in $(seq "${DS_WAIT:-570}"); do [ -f "$D/rc" ] && break; sleep 1; done
  # Finished within this call: bring its tables back now (a machine given back between calls
  # takes /tmp/pb-default with it).
  [ -f "$D/rc" ] && { collect; exit 0; }
  tail -n 5 "$D/run.log"; echo "still running"
  ;;
default-wait)
  for _ in $(seq 560); do [ -f "$D/rc" ] && break; sleep 1; done
  [ -f "$D/rc" ] || { echo "still running"; tail -n 5 "$D/run.log"; exit 1; }
  collect
  ;;
*)
  echo "unknown part $PART: check, profile, gpipe, beyond, default-start or default-wait"; exit 2 ;;
esac
