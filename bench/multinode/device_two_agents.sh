#!/usr/bin/env bash
# Two agents on one host against one agent (issue 14, item 5; docs/MULTINODE.md).
#
#   bench/multinode/device_two_agents.sh [--cpu] [OUT]        (default OUT: /tmp/parbench-two-agents)
#
# GPU (a host with 2 or 4 GPUs): DDP and FSDP on gpt-small, NCCL, world sizes 2 and 4 (4 only with
# 4 GPUs), measured twice: by one agent (plain `parbench run`) and by two agents of one run
# (`--nnodes 2`, rendezvous on 127.0.0.1, each agent seeing its half of the GPUs through
# CUDA_VISIBLE_DEVICES, so NCCL runs across the two agents), 3 interleaved repeats each. Then one
# table: the harness's median step time and 95% interval of each cell under one and two agents,
# their ratio, whether it is within 5% and whether the intervals overlap, and the transport NCCL
# chose between the two agents' GPUs (NCCL_DEBUG=INFO in the two-agent runs: P2P/IPC, P2P/CUMEM or
# SHM, i.e. through host memory).
# --cpu: the same logic on gloo/CPU with gpt-tiny (world sizes 2 and 4: 1 and 2 ranks per agent).
# Budget: about 5 minutes on 4 H100s (measured 209 s with one repeat on 2026-11-26; repeats add ~3 s a cell).
set -euo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cpu=0
if [ "${1:-}" = "--cpu" ]; then cpu=1; shift; fi
out=${1:-/tmp/parbench-two-agents}
py=${PYTHON:-python}
rm -rf "$out" && mkdir -p "$out"
start=$(date +%s)

if [ $cpu = 1 ]; then
  export OMP_NUM_THREADS=1
  common=(--device cpu --backends gloo --workloads gpt-tiny)
  slots=4
else
  slots=$(nvidia-smi -L | wc -l)
  if [ "$slots" -lt 2 ]; then echo "two agents need 2 or more GPUs; $slots visible" >&2; exit 2; fi
  common=(--device cuda --backends nccl --workloads gpt-small)
fi
common+=(--strategies ddp,fsdp --steps 20 --warmup 5 --repeats "${REPEATS:-3}" --target-ci 0 --budget off --profile-steps 1 --sample-hz 10
         --cell-timeout 120 --rdzv-timeout 120 --no-progress)
sizes=(2)
if [ "$slots" -ge 4 ]; then sizes=(2 4); fi
IFS=, ; all="${sizes[*]}" ; unset IFS

echo "== one agent: world sizes $all"
if ! $py -m bench.cli run "${common[@]}" --world-sizes "$all" --out "$out/one" > "$out/one.log" 2>&1; then
  tail -n 20 "$out/one.log" >&2
  exit 1
fi

for ws in "${sizes[@]}"; do
  half=$((ws / 2))
  vis0="" vis1=""
  if [ $cpu = 0 ]; then vis0=$(seq -s, 0 $((half - 1))); vis1=$(seq -s, "$half" $((ws - 1))); fi
  port=$((29500 + ws))
  echo "== two agents: world size $ws (GPUs ${vis0:-cpu} | ${vis1:-cpu}), rendezvous 127.0.0.1:$port"
  for node in 0 1; do
    vis=$vis0; [ $node = 1 ] && vis=$vis1
    if [ $cpu = 0 ]; then export CUDA_VISIBLE_DEVICES=$vis NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM; fi
    $py -m bench.cli run "${common[@]}" --world-sizes "$ws" --nnodes 2 --node-rank $node \
      --rdzv-endpoint "127.0.0.1:$port" --out "$out/two-$ws" > "$out/two-$ws-node$node.log" 2>&1 &
    pids[$node]=$!
  done
  unset CUDA_VISIBLE_DEVICES NCCL_DEBUG NCCL_DEBUG_SUBSYS
  rc=0
  wait "${pids[0]}" || rc=$?
  wait "${pids[1]}" || rc=$?
  if [ $rc != 0 ]; then tail -n 20 "$out/two-$ws-node0.log" "$out/two-$ws-node1.log" >&2; exit 1; fi
done

$py - "$out" "$cpu" <<'EOF'
import collections, re, subprocess, sys
from pathlib import Path
from bench.results import load_run

out, cpu = Path(sys.argv[1]), sys.argv[2] == "1"
run = lambda d: next(p for p in d.iterdir() if (p / "meta.json").exists())
one, _, meta = load_run(run(out / "one"))
card = "CPU (gloo)" if cpu else subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                               capture_output=True, text=True).stdout.splitlines()[0]
print(f"\ncard: {card}; torch {meta.get('torch')}; NCCL {meta.get('nccl')}")
print("| strategy | world size | one agent ms [95%] | two agents ms [95%] | two / one | within 5% | intervals overlap | link | NCCL transports (two agents) |")
print("|---|---|---|---|---|---|---|---|---|")
for d in sorted(out.glob("two-*")):
    if not d.is_dir():
        continue
    two, _, _ = load_run(run(d))
    # NCCL_DEBUG=INFO lines 'Channel 00/0 : 1[1] -> 2[0] via P2P/IPC' from the ranks' logs of this run,
    # only channels between the agents (node 0 holds the first half of the ranks, node 1 the rest)
    half = int(d.name.split("-")[1]) // 2
    vias = collections.Counter(m.group(3) for f in d.rglob("*.log")
                               for m in re.finditer(r"(\d+)\[\d+\] -> (\d+)\[\d+\] via (\S+)", f.read_text(errors="replace"))
                               if (int(m.group(1)) < half) != (int(m.group(2)) < half))
    transports = ", ".join(f"{k} x{v}" for k, v in vias.most_common()) or ("n/a (gloo)" if cpu else "none logged")
    for _, r in two[(two["strategy"] != "single")].iterrows():
        o = one[(one["strategy"] == r["strategy"]) & (one["world_size"] == r["world_size"])]
        if r["status"] != "ok" or o.empty or o.iloc[0]["status"] != "ok":
            why = r["reason"] if r["status"] != "ok" else (o.iloc[0]["reason"] if len(o) else "no one-agent cell")
            print(f"| {r['strategy']} | {r['world_size']} | - | - | - | not compared: {why} | | | |")
            continue
        a, b = o.iloc[0], r
        lo_a, hi_a, lo_b, hi_b = (x * 1e3 for x in (a["step_time_ci_low_s"], a["step_time_ci_high_s"],
                                                      b["step_time_ci_low_s"], b["step_time_ci_high_s"]))
        ma, mb = a["step_time_median_s"] * 1e3, b["step_time_median_s"] * 1e3
        print(f"| {r['strategy']} | {r['world_size']} | {ma:.2f} [{lo_a:.2f}, {hi_a:.2f}] | {mb:.2f} [{lo_b:.2f}, {hi_b:.2f}] | "
              f"{mb / ma:.3f} | {'yes' if abs(mb / ma - 1) <= 0.05 else 'no'} | {'yes' if lo_b <= hi_a and lo_a <= hi_b else 'no'} | "
              f"{r['link']} | {transports} |")
EOF
echo "done in $(( $(date +%s) - start )) s; runs in $out"
