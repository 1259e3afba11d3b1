#!/usr/bin/env bash
# Two agents on one host against one agent (docs/guides/multinode.md).
#
#   tools/device/two_agents.sh [--cpu] [OUT]        (default OUT: /tmp/parbench-two-agents)
#
# GPU (a host with 2 or 4 GPUs): DDP and FSDP on gpt-200m at global batch 64 (TA_WL, TA_GB), NCCL,
# world sizes 2 and 4 (4 only with 4 GPUs), measured twice: by one agent (plain `parbench run`) and by two agents of one run
# (`--nnodes 2`, rendezvous on 127.0.0.1, each agent seeing its half of the GPUs through
# CUDA_VISIBLE_DEVICES, so NCCL runs across the two agents), in REPEATS rounds (default 3) that
# alternate the order (one agent then two in odd rounds, two then one in even ones), so the host's
# drift lands on both sides alike. Then one table per cell: the round medians under one and two
# agents, the median per-round ratio with its range, a verdict (interleave.py's rule at 5%: "within
# 5%" when every round is, "two agents slower/faster" when every round agrees and the median is
# further from 1 than the one-agent side's own round-to-round spread, else "inside noise"), the same ratio with
# each side over its own run's one-device reference, and the transport NCCL chose between the two
# agents' GPUs (NCCL_DEBUG=INFO in every GPU run (both sides alike), read from the two-agent runs: P2P/IPC, P2P/CUMEM or SHM, i.e. through
# host memory).
# SUMMARY_ONLY=1: run nothing; print the table over the rounds already under OUT (e.g. several calls'
# folders merged into one OUT: one/rN, two-2/rN, two-4/rN).
# --cpu: the same logic on gloo/CPU with gpt-tiny (world sizes 2 and 4: 1 and 2 ranks per agent).
# Why GPU-bound: with gpt-small (launch-bound, 10-30 ms steps) the one-agent side's own round
# medians move 9.7-15.3 ms on 2 H100s, and two 2-GPU runs give FSDP ratios of 1.315 and 0.935:
# nothing at 5% can be read from that (docs/evidence/two-agents-vs-one-h100.parquet). At global batch 64 the DDP x2 noise floor
# is 1.6-1.8% (docs/evidence/gate-verdicts-h100.csv).
# Budget: each round is a one-agent run plus one two-agent run per world size. With gpt-small:
# 351 s for 3 rounds on 2 H100s, 209 s for one round at 2 and 4 GPUs on 4 H100s. At global batch 64
# on 4 H100s one round takes about 310 s, so a 10-minute call holds one round (REPEATS=1; continue
# with FIRST_ROUND). (CPU --cpu, 2 rounds: 337 s.)
set -euo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cpu=0
if [ "${1:-}" = "--cpu" ]; then cpu=1; shift; fi
out=${1:-/tmp/parbench-two-agents}
py=${PYTHON:-python}
if [ "${SUMMARY_ONLY:-0}" = 1 ]; then
  [ -d "$out/one" ] || { echo "SUMMARY_ONLY=1: $out has no one/ rounds to summarise" >&2; exit 2; }
else
  rm -rf "$out" && mkdir -p "$out"
fi
start=$(date +%s)

if [ $cpu = 1 ]; then
  export OMP_NUM_THREADS=1
  common=(--device cpu --backends gloo --workloads gpt-tiny)
  slots=4
else
  if [ "${SUMMARY_ONLY:-0}" = 1 ]; then slots=0; else slots=$(nvidia-smi -L | wc -l); fi
  if [ "${SUMMARY_ONLY:-0}" != 1 ] && [ "$slots" -lt 2 ]; then echo "two agents need 2 or more GPUs; $slots visible" >&2; exit 2; fi
  common=(--device cuda --backends nccl --workloads "${TA_WL:-gpt-200m}" --global-batch "${TA_GB:-64}")
  # NCCL's log names the transport between the agents; both sides get it, so that the logging is not
  # a difference between them
  export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM
fi
common+=(--strategies ddp,fsdp --steps 20 --warmup 5 --repeats 1 --target-ci 0 --budget off --profile-steps 1 --sample-hz 10
         --cell-timeout 120 --rdzv-timeout 120 --no-progress)
sizes=(2)
if [ "$slots" -ge 4 ]; then sizes=(2 4); fi
IFS=, ; all="${sizes[*]}" ; unset IFS
rounds=${REPEATS:-3}
if [ "$rounds" -lt 1 ]; then echo "REPEATS=$rounds: need at least 1 round" >&2; exit 2; fi

one_agent() {  # round $1: every world size in one run of one agent
  echo "== round $1: one agent, world sizes $all"
  if ! $py -m bench run "${common[@]}" --world-sizes "$all" --out "$out/one/r$1" > "$out/one-r$1.log" 2>&1; then
    tail -n 20 "$out/one-r$1.log" >&2
    exit 1
  fi
}

two_agents() {  # round $1: each world size as one run of two agents
  local ws half vis0 vis1 port node vis rc
  for ws in "${sizes[@]}"; do
    half=$((ws / 2))
    vis0="" vis1=""
    if [ $cpu = 0 ]; then vis0=$(seq -s, 0 $((half - 1))); vis1=$(seq -s, "$half" $((ws - 1))); fi
    port=$((29500 + ws))
    echo "== round $1: two agents, world size $ws (GPUs ${vis0:-cpu} | ${vis1:-cpu}), rendezvous 127.0.0.1:$port"
    for node in 0 1; do
      vis=$vis0; [ $node = 1 ] && vis=$vis1
      if [ $cpu = 0 ]; then export CUDA_VISIBLE_DEVICES=$vis; fi
      $py -m bench run "${common[@]}" --world-sizes "$ws" --nnodes 2 --node-rank $node \
        --rdzv-endpoint "127.0.0.1:$port" --out "$out/two-$ws/r$1" > "$out/two-$ws-r$1-node$node.log" 2>&1 &
      pids[$node]=$!
    done
    unset CUDA_VISIBLE_DEVICES
    rc=0
    wait "${pids[0]}" || rc=$?
    wait "${pids[1]}" || rc=$?
    if [ $rc != 0 ]; then tail -n 20 "$out/two-$ws-r$1-node0.log" "$out/two-$ws-r$1-node1.log" >&2; exit 1; fi
  done
}

# A B, B A, A B ...: the host's drift between runs lands on both sides alike (one agent first in
# odd rounds, two agents first in even ones)
# FIRST_ROUND=2 starts at round 2 (two agents first): a second call continues the alternation, and
# the summary below replays over both calls' folders merged (one round of gpt-200m fills a 4-GPU call)
first=${FIRST_ROUND:-1}
if [ "${SUMMARY_ONLY:-0}" = 1 ]; then rounds=0; fi
for r in $(seq "$first" $((first + rounds - 1))); do
  if [ $((r % 2)) = 1 ]; then one_agent "$r"; two_agents "$r"; else two_agents "$r"; one_agent "$r"; fi
done

$py - "$out" "$cpu" <<'EOF'
import collections, json, re, statistics, sys
from pathlib import Path
from tools.baselines.interleave import verdict
from bench.results.run import load_run

out, cpu = Path(sys.argv[1]), sys.argv[2] == "1"


def runs(d: Path) -> dict[int, tuple]:
    """Round number -> (cells, meta) of that round's run folder under d (the latest, by its
    time-stamped name, if a round holds several)."""
    found = {}
    for r in sorted(d.glob("r*")):
        every = sorted(p for p in r.iterdir() if (p / "meta.json").exists())
        folders = [p for p in every if (p / "cells.parquet").exists()]  # not cut off before its first cell
        for p in every:
            if p not in folders:
                print(f"note: {p} has no cells (cut off); left out", file=sys.stderr)
        if not folders:
            continue
        if len(folders) > 1:
            print(f"note: {r} holds {len(folders)} runs; using the latest, {folders[-1].name}", file=sys.stderr)
        folder = folders[-1]
        cells, _, meta = load_run(folder)
        found[int(r.name[1:])] = (cells, meta)
    return found


def threads(cells, strategy, ws) -> str:
    """The ranks' CPU threads (rank_placement), e.g. '16' or '16/1' if they differ."""
    c = cells[(cells["strategy"] == strategy) & (cells["world_size"] == ws) & (cells["status"] == "ok")]
    if not len(c) or "rank_placement" not in c or not isinstance(c.iloc[0]["rank_placement"], str):
        return "?"
    got = sorted({p.get("threads") for p in json.loads(c.iloc[0]["rank_placement"])}, key=str)
    return "/".join("?" if t is None else str(t) for t in got)


def median_ms(cells, strategy, ws):
    c = cells[(cells["strategy"] == strategy) & (cells["world_size"] == ws) & (cells["status"] == "ok")]
    return float(c.iloc[0]["step_time_median_s"]) * 1e3 if len(c) else None


one = runs(out / "one")
if not one:
    sys.exit(f"no one-agent round with cells under {out / 'one'}: nothing to compare")
meta = next(iter(one.values()))[1]
# the card the runs recorded (meta.json gpus), so that a replay elsewhere names the machine that measured
card = "CPU (gloo)" if cpu else (meta.get("gpus") or ["?"])[0]
print(f"\ncard: {card}; torch {meta.get('torch')}; NCCL {meta.get('nccl')}; rounds: {len(one)} (A B, B A, ...)")
print("ratio = two agents / one agent of the same round, median of rounds [min, max]; normalised = the same with each"
      " side's step time over its own run's one-device reference (the host's drift between the two runs divides out)")
print("| strategy | world size | one agent ms (round medians) | two agents ms | ratio [min, max] | verdict (5%) |"
      " normalised ratio [min, max] | rank threads (one / two) | link | NCCL transports (two agents) |")
print("|---|---|---|---|---|---|---|---|---|---|")
fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
for d in sorted(out.glob("two-*")):
    if not d.is_dir():
        continue
    ws = int(d.name.split("-")[1])
    two = runs(d)
    # NCCL_DEBUG=INFO lines 'Channel 00/0 : 1[1] -> 2[0] via P2P/IPC' from the ranks' logs of these runs,
    # only channels between the agents (node 0 holds the first half of the ranks, node 1 the rest)
    half = ws // 2
    vias = collections.Counter(m.group(3) for f in d.rglob("*.log")
                               for m in re.finditer(r"(\d+)\[\d+\] -> (\d+)\[\d+\] via (\S+)", f.read_text(errors="replace"))
                               if (int(m.group(1)) < half) != (int(m.group(2)) < half))
    transports = ", ".join(f"{k} x{v}" for k, v in vias.most_common()) or ("n/a (gloo)" if cpu else "none logged")
    for strategy in ("ddp", "fsdp"):
        a, b, ratio, norm, link, thr = [], [], [], [], "", set()
        for r in sorted(set(one) & set(two)):
            x, y = median_ms(one[r][0], strategy, ws), median_ms(two[r][0], strategy, ws)
            if x is None or y is None:
                continue
            a.append(x), b.append(y), ratio.append(y / x)
            thr.add(f"{threads(one[r][0], strategy, ws)} / {threads(two[r][0], strategy, ws)}")
            rx, ry = median_ms(one[r][0], "single", 1), median_ms(two[r][0], "single", 1)
            if rx and ry:
                norm.append((y / ry) / (x / rx))
            row = two[r][0]
            link = str(row[row["strategy"] == strategy].iloc[0]["link"]) if (row["strategy"] == strategy).any() else link
        if not ratio:
            print(f"| {strategy} | {ws} | - | - | - | not compared: no round with both cells ok | | | | |")
            continue
        med = statistics.median(ratio)
        nm = f"{statistics.median(norm):.3f} [{min(norm):.3f}, {max(norm):.3f}]" if norm else "-"
        floor = max(a) / min(a) - 1  # the one-agent side's own round-to-round spread
        print(f"| {strategy} | {ws} | {fmt(a)} | {fmt(b)} | {med:.3f} [{min(ratio):.3f}, {max(ratio):.3f}] | "
              f"{verdict(ratio, floor, tolerance=0.05, side='two agents')} | {nm} | {', '.join(sorted(thr))} | {link} | "
              f"{transports} |")
EOF
echo "done in $(( $(date +%s) - start )) s; runs in $out"
