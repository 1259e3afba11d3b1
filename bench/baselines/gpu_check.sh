#!/usr/bin/env bash
# The harness-vs-plain check on GPUs (device tool). Usage: bash bench/baselines/gpu_check.sh OUTDIR [steps]
# Runs, in one call: the plain single-GPU and DDP loops (NCCL and Gloo), then the harness on the same
# model, and prints the comparison table last.
set -uo pipefail
out=${1:?outdir}; steps=${2:-30}; wl=${WORKLOAD:-gpt-200m}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"
: > "$out/plain.jsonl"
python3 -m bench.baselines.plain_ddp --workload "$wl" --steps "$steps" --no-ddp | tee -a "$out/plain.jsonl"
for be in nccl gloo; do
  python3 -m torch.distributed.run --nproc-per-node 2 -m bench.baselines.plain_ddp --workload "$wl" \
    --steps "$steps" --backend $be | tee -a "$out/plain.jsonl"
done
python3 -m bench.cli run --workloads "$wl" --strategies all --backends nccl,gloo --world-sizes 1,2 \
  --steps "$steps" --warmup 5 --out "$out/runs" --no-progress ${EXTRA_ARGS:-} > "$out/harness.txt" 2>&1
run=$(ls -d "$out"/runs/*/ | tail -n 1)
python3 -m bench.cli report "$run" > /dev/null
python3 - "$run" "$out/plain.jsonl" <<'PY'
import json, sys
import pandas as pd
cells = pd.read_parquet(sys.argv[1] + "/cells.parquet")
plain = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
print(f"card: {plain[0]['gpu'] if plain else '?'}")
print(f"{'what':42s} {'mean ms':>9s} {'median ms':>9s} {'vs plain':>9s}")
for p in plain:
    strat = "single" if p["world_size"] == 1 else "ddp"
    be = "none" if strat == "single" else p["backend"]
    h = cells[(cells.strategy == strat) & (cells.backend == be) & (cells.world_size == p["world_size"])
              & (cells.status == "ok")]
    print(f"{'plain ' + p['baseline'] + ' ' + be + ' x' + str(p['world_size']):42s} {p['step_time_mean_s']*1e3:9.2f}")
    if len(h):
        r = h.iloc[0]
        print(f"{'harness ' + strat + ' ' + be + ' x' + str(p['world_size']):42s} {r.step_time_mean_s*1e3:9.2f} "
              f"{r.step_time_median_s*1e3:9.2f} {r.step_time_mean_s / p['step_time_mean_s'] - 1:+9.2%}")
cols = ["strategy", "backend", "world_size", "status", "step_time_median_s", "throughput_samples_s",
        "scaling_efficiency", "mfu", "peak_mem_bytes", "parity_rel_err", "parity_ok", "overhead_s"]
pd.set_option("display.width", 250); pd.set_option("display.max_columns", 20)
print(cells[cols].to_string(index=False))
PY
