#!/usr/bin/env bash
# GPU experiments on a machine with 2 or 4 GPUs, one or more phases a call (each fits a 10-minute
# call). Usage (repository root): OUT=DIR bash tools/device/device_run.sh PHASE [PHASE...]
#   check  every strategy on NCCL at 2 and 4 GPUs (and the reference), gpt-small, 4 fixed steps
#   ab     the default strategy options vs fsdp_mp=off, fsdp_units=all, pp_balance=params, tp_plan=megatron
#          (gpt-200m, fsdp, pipeline-1f1b, tensor on 4 GPUs, 3 repeats each)
#   smoke  GPU tests + every strategy on gpt-small at world sizes 1,2(,4), NCCL and Gloo, 4 steps
#   two    on 2 GPUs: plain DDP loops vs harness (gpt-200m), every strategy on NCCL and Gloo
#   overhead  on 2 GPUs: the same DDP cell with the sampler off / 20 Hz / 100 Hz / off again
#   budget the default matrix under the default 10-minute budget, timed (4 GPUs: 168 cells), with
#          each process group's start-up split (meta.json group_starts)
#   four   on 4 GPUs: DDP, FSDP, pipelines, TP at 1,2,4 and the 2x2 hybrids on NCCL (gpt-200m)
#   i2, i4, il  harness vs plain loops interleaved (interleave.py, 6 families, 3 rounds) at 2, 4 or both
#   bisect where a harness-vs-plain gap comes from: the profiler after-effect probe; both sides on 1
#          OpenMP thread; one harness call per family; nvidia-smi and vmstat in the background
#   fix    the after-effect probe with and without TEARDOWN_CUPTI, then 6 families at 4 GPUs
#   gb     GPU-bound: harness vs plain interleaved at global batch 64 on 2 GPUs (IL_GB, IL_WS,
#          IL_FAM: ddp,fsdp,pipeline-1f1b,tensor-sp; IL_TIMEOUT, IL_DEADLINE), 3 rounds, noise verdicts
#   after  does a cell depend on the cell before it in the same rank processes? ddp, fsdp,
#          pipeline-1f1b at 2 GPUs (AF_WS), global batch 64, --repeats 6 (orders: a balanced Latin square),
#          then tools/baselines/order_effect.py over the run; once with --profile-steps 2 and once
#          with 0 (AF_PROFILE)
#   pass   harness --profile-at end, then inline (PA_AT), against the plain loop, 3 rounds each
#          (IL_FAM default fsdp, IL_WS default 4)
#   order  FSDP after DDP and FSDP first in the harness's processes, 4 GPUs (IL_WS), 3 rounds each
#   tail   two agents on one host vs one agent (two_agents.sh: NCCL across agents, whole runs alternating)
#   trun   DDP and FSDP (IL_WS GPUs, default 4) with the plain programs under torchrun
#   gate   the regression gate: A1 = ddp,fsdp,pipeline-1f1b at 2 and 4 GPUs with --repeats 5; then on
#          2 GPUs B (ddp 5% slower: tests.regress_helpers:DDPSlowed) and A2 (= A1); compare A2|A1 and
#          B|A1; G_GB=64 G_STRATS=ddp,fsdp G_WS=2: the GPU-bound variant (larger batch per GPU)
# Results go to $OUT (tarred run folders + logs); a short table is printed last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-out}; R=/tmp/pb-results; mkdir -p "$OUT" "$R"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpus.csv"
pb() { python3 -m bench run --no-progress --out "$R/$1" "${@:2}"; }
show() {  # short table of the latest run under $R/$1
  python3 - "$(ls -d "$R/$1"/*/ | tail -n 1)" <<'PY'
import sys, pandas as pd
from bench.results.run import load_run
c = load_run(sys.argv[1])[0]
cols = [x for x in ["strategy", "backend", "world_size", "mesh", "status", "step_time_median_s", "repeat_spread",
        "throughput_samples_s", "scaling_efficiency", "mfu", "peak_mem_bytes", "parity_rel_err", "param_share",
        "comm_calls_per_step", "exposed_comm_s", "idle_frac", "stage_blocks", "option_tp_plan", "fsdp_param_dtype",
        "noise"] if x in c]
c = c[c.status != "skipped"].copy()
for k in ("step_time_median_s", "comm_time_s", "exposed_comm_s"):
    if k in c: c[k] = (c[k] * 1e3).round(2)
if "peak_mem_bytes" in c: c["peak_mem_bytes"] = (c["peak_mem_bytes"] / 2**30).round(2)
pd.set_option("display.width", 250); pd.set_option("display.max_columns", 30); pd.set_option("display.max_colwidth", 70)
print(c[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
bad = c[c.status != "ok"]
if len(bad): print(bad[["strategy", "backend", "world_size", "status", "reason"]].to_string(index=False))
PY
}
FIRST=${1:-none}
for phase in "$@"; do
case "$phase" in
check)  # every strategy on NCCL at 2 and 4 GPUs (and the reference), a few fixed steps: does it all run?
  timeout 170 python3 -m bench run --no-progress --out "$R/check" --workloads gpt-small --strategies all \
     --backends nccl --world-sizes 2,4 --steps 4 --warmup 2 --warmup-max 0 --steps-max 0 --budget off \
     --profile-steps 1 --cell-timeout 60 > "$OUT/check.log" 2>&1
  show check ;;
ab)  # the default options vs the simpler ones (variant old), gpt-200m on 4 GPUs, 3 interleaved repeats each
  for variant in new old; do
    opts=(); [ "$variant" = old ] && opts=(--option fsdp_mp=off --option fsdp_units=all --option pp_balance=params --option tp_plan=megatron)
    timeout 110 python3 -m bench run --no-progress --out "$R/ab-$variant" --workloads gpt-200m \
       --strategies fsdp,pipeline-1f1b,tensor --backends nccl --world-sizes 4 --repeats 3 --steps 10 --warmup 3 \
       --warmup-max 0 --steps-max 0 --budget off --profile-steps 0 --sample-hz 0 "${opts[@]}" > "$OUT/ab-$variant.log" 2>&1
    show "ab-$variant"
  done ;;
smoke)
  CUDA_VISIBLE_DEVICES=0,1 timeout 240 python3 -m pytest -q -x tests/gpu 2>&1 | tail -5
  pb smoke --workloads gpt-small --strategies all --backends nccl,gloo --world-sizes 1,2,4 --steps 4 --warmup 2 \
     --cell-timeout 60 > "$OUT/smoke.log" 2>&1
  show smoke ;;
two)
  (  # a subshell: the GPU mask must not leak into the phases after this one
  export CUDA_VISIBLE_DEVICES=0,1
  : > "$OUT/plain.jsonl"
  python3 -m tools.baselines.plain_ddp --workload gpt-200m --steps 20 --no-ddp >> "$OUT/plain.jsonl"
  for be in nccl gloo; do
    python3 -m torch.distributed.run --nproc-per-node 2 -m tools.baselines.plain_ddp --workload gpt-200m \
      --steps 20 --backend $be 2>/dev/null >> "$OUT/plain.jsonl"
  done
  pb two --workloads gpt-200m --strategies all --backends nccl,gloo --world-sizes 1,2 --steps 20 --warmup 5 \
     --cell-timeout 150 > "$OUT/two.log" 2>&1
  python3 - "$OUT/plain.jsonl" "$R" <<'PY'
import json, sys, glob, pandas as pd
plain = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
from bench.results.run import load_run
cells = load_run(glob.glob(sys.argv[2] + "/two/*/")[0])[0]
print("harness vs plain loop (same model, batches, optimizer; mean step time over 20 steps):")
for p in plain:
    strat, be = ("single", "nccl") if p["world_size"] == 1 else ("ddp", p["backend"])
    h = cells[(cells.strategy == strat) & (cells.backend == be) & (cells.world_size == p["world_size"]) & (cells.status == "ok")]
    if len(h):
        r = h.iloc[0]
        print(f"  {strat:6s} {be:5s} x{p['world_size']}  plain {p['step_time_mean_s']*1e3:8.2f} ms  harness mean "
              f"{r.step_time_mean_s*1e3:8.2f} ms (median {r.step_time_median_s*1e3:8.2f})  "
              f"diff {r.step_time_mean_s/p['step_time_mean_s']-1:+.2%}  [{p['gpu']}]")
PY
  show two
  ) ;;
overhead)
  (  # a subshell: the GPU mask must not leak into the phases after this one
  export CUDA_VISIBLE_DEVICES=0,1
  for hz in 0 20 100 0b; do  # sampler overhead: same cell with the sampler off, at 20 Hz, at 100 Hz, off again
    pb "hz$hz" --workloads gpt-200m --strategies ddp --backends nccl --world-sizes 2 --steps 60 --warmup 5 \
       --profile-steps 0 --sample-hz "${hz%b}" > /dev/null 2>&1
  done
  python3 - "$R" <<'PY'
import sys, glob, pandas as pd
print("sampler overhead (ddp nccl x2, gpt-200m, 60 steps):")
for hz in ("0", "20", "100", "0b"):
    from bench.results.run import load_run
    c = load_run(glob.glob(f"{sys.argv[1]}/hz{hz}/*/")[0])[0]
    r = c[c.strategy == "ddp"].iloc[0]
    print(f"  {hz:>4s} Hz: median {r.step_time_median_s*1e3:.3f} ms  CI [{r.step_time_ci_low_s*1e3:.3f}, "
          f"{r.step_time_ci_high_s*1e3:.3f}]  mean {r.step_time_mean_s*1e3:.3f} ms")
PY
  ) ;;
i2|i4|il)  # il: 2 and 4 GPUs in one call (one harness call per round covers both)
  ws=${phase#i}; [ "$phase" = il ] && ws=2,4
  PYTHONPATH=. timeout "${IL_TIMEOUT:-480}" python3 tools/baselines/interleave.py --world-sizes "$ws" \
     --families ddp,fsdp,pipeline-gpipe,pipeline-1f1b,tensor,tensor-sp --repeats 3 --steps "${IL_STEPS:-10}" \
     --warmup "${IL_WARMUP:-3}" --deadline-s "${IL_DEADLINE:-460}" --out "$OUT/$phase" > "$OUT/$phase.log" 2>&1
  tail -n 16 "$OUT/$phase.log" ;;
bisect)  # a harness-vs-plain gap taken apart, one call (~8 min on 4x H100): host telemetry in the background;
  # (a) does a profiler session slow later launch-bound steps of its process (the harness profiles
  # each cell's first repeat, the plain loops never do)? (b) FSDP and 1F1B at 4 GPUs, 3 ABBA rounds,
  # every rank of both sides on one OpenMP thread; (c) one harness call per family (no process reuse,
  # so no earlier cell's profiler session), 2 rounds (A B, B A)
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
     --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 & smi=$!
  vmstat -t 2 > "$OUT/vmstat.txt" 2>&1 & vms=$!
  CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m tools.baselines.profiler_aftereffect > "$OUT/aftereffect.log" 2>&1
  head -n 3 "$OUT/aftereffect.log"
  PYTHONPATH=. OMP_NUM_THREADS=1 timeout 240 python3 tools/baselines/interleave.py --world-sizes 4 \
     --families fsdp,pipeline-1f1b --repeats 3 --steps 8 --warmup 3 --deadline-s 230 --out "$OUT/omp1" \
     > "$OUT/omp1.log" 2>&1
  tail -n 5 "$OUT/omp1.log"
  PYTHONPATH=. timeout 250 python3 tools/baselines/interleave.py --world-sizes 4 --families fsdp,pipeline-1f1b \
     --repeats 2 --steps 8 --warmup 3 --pairwise --deadline-s 240 --out "$OUT/pairwise" > "$OUT/pairwise.log" 2>&1
  tail -n 5 "$OUT/pairwise.log"
  kill $smi $vms 2>/dev/null
  awk 'NR>2 {st+=$17; us+=$13; sy+=$14; n++; if ($17>mx) mx=$17} END {if (n) printf "vmstat: %d samples, mean us %.1f sy %.1f steal %.1f%% (max %d%%)\n", n, us/n, sy/n, st/n, mx}' "$OUT/vmstat.txt"
  (cd "$OUT" && tar czf bisect.tgz omp1 pairwise omp1.log pairwise.log smi.csv vmstat.txt && rm -rf omp1 pairwise smi.csv) ;;
fix)  # TEARDOWN_CUPTI=1, the ranks' default (~8 min on 4x H100): the probe without and with teardown;
  # then every family at 4 GPUs, 3 ABBA rounds, the harness with 2 GPU-profiled steps per cell
  for td in 0 1; do
    CUDA_VISIBLE_DEVICES=0 TEARDOWN_CUPTI=$td timeout 60 python3 -m tools.baselines.profiler_aftereffect \
      > "$OUT/aftereffect-td$td.log" 2>&1
    echo "TEARDOWN_CUPTI=$td"; grep -E "^(before|after)" "$OUT/aftereffect-td$td.log"
  done
  PYTHONPATH=. timeout "${IL_TIMEOUT:-440}" python3 tools/baselines/interleave.py --world-sizes "${IL_WS:-4}" \
     --families "${IL_FAM:-ddp,fsdp,pipeline-gpipe,pipeline-1f1b,tensor,tensor-sp}" --repeats 3 --steps 8 --warmup 3 \
     --harness-profile-steps 2 --deadline-s "${IL_DEADLINE:-430}" --out "$OUT/fix" > "$OUT/fix.log" 2>&1
  tail -n 10 "$OUT/fix.log"
  (cd "$OUT" && tar czf fix.tgz fix fix.log aftereffect-td*.log && rm -rf fix) ;;
gb)  # GPU-bound steps: gpt-200m at global batch 64 (the default 16 is CPU-launch-bound on the
  # shared hosts, plain round medians moving by 40-60%); both sides get the batch, the table gives each family's
  # plain round-to-round spread and a noise verdict (pipelines: 8 micro-batches of 8)
  PYTHONPATH=. timeout "${IL_TIMEOUT:-440}" python3 tools/baselines/interleave.py --world-sizes "${IL_WS:-2}" \
     --families "${IL_FAM:-ddp,fsdp,pipeline-1f1b,tensor-sp}" --global-batch "${IL_GB:-64}" --repeats 3 --steps 8 \
     --warmup 3 --harness-profile-steps 2 --deadline-s "${IL_DEADLINE:-430}" --out "$OUT/gb" > "$OUT/gb.log" 2>&1
  tail -n 10 "$OUT/gb.log"
  (cd "$OUT" && tar czf gb.tgz gb gb.log && rm -rf gb) ;;
pass)  # the harness with its profiled steps in a pass after every timed step (--profile-at end, the
  # CUDA default) against the plain loop, then inline (profiled right after each cell's first
  # repeat), 3 rounds each, ${IL_FAM:-fsdp} at ${IL_WS:-4} GPUs
  # (~230 s each on 4 H100s for FSDP alone)
  dirs=()  # the orders run; their logs stay beside the archive too
  for at in ${PA_AT:-end inline}; do
    dirs+=("pass-$at")
    PYTHONPATH=. timeout "${PA_TIMEOUT:-280}" python3 tools/baselines/interleave.py --world-sizes "${IL_WS:-4}" \
       --families "${IL_FAM:-fsdp}" --global-batch "${IL_GB:-64}" --repeats 3 --steps 8 --warmup 3 \
       --harness-profile-steps 2 --harness-profile-at "$at" --deadline-s "${PA_DEADLINE:-270}" \
       --out "$OUT/pass-$at" > "$OUT/pass-$at.log" 2>&1
    echo "== harness --profile-at $at"; grep -E "^[a-z-]+ +[0-9]+ +[0-9]+ " "$OUT/pass-$at.log"
  done
  (cd "$OUT" && tar czf pass.tgz "${dirs[@]}" pass-*.log && rm -rf "${dirs[@]}") ;;
order)  # FSDP x4 can run 4.2% behind its plain loop as the cell after DDP, whose profiled steps ran in
  # the same processes; the cell order follows --families, so this measures FSDP after DDP and FSDP
  # first, before any profiling in its processes (~6 min on 4 H100s)
  for fams in ddp,fsdp fsdp,ddp; do
    PYTHONPATH=. timeout 290 python3 tools/baselines/interleave.py --world-sizes "${IL_WS:-4}" --families "$fams" \
       --global-batch "${IL_GB:-64}" --repeats 3 --steps 12 --warmup 3 --harness-profile-steps 2 --deadline-s 275 \
       --out "$OUT/order-${fams/,/-}" > "$OUT/order-${fams/,/-}.log" 2>&1
    echo "== harness order $fams"; grep -E "^(ddp|fsdp) " "$OUT/order-${fams/,/-}.log"
  done
  (cd "$OUT" && tar czf order.tgz order-* && rm -rf order-ddp-fsdp order-fsdp-ddp order-*.log) ;;
tail)  # two agents on one host (NCCL across agents) against one agent, whole runs alternating
  # (gpt-200m: one round takes about 310 s on 4 GPUs, so a 4-GPU call holds one round: REPEATS=1)
  PYTHON=python3 timeout "${TA_TIMEOUT:-570}" bash tools/device/two_agents.sh "$OUT/two-agents" \
     > "$OUT/two-agents.log" 2>&1
  echo "two agents: exit $?"; tail -n 12 "$OUT/two-agents.log"
  (cd "$OUT" && tar czf tail.tgz two-agents two-agents.log && rm -rf two-agents) ;;
after)  # 1F1B at 192 ms as the first cell of its processes can run 216-221 ms (steps 192-237) after
  # DDP and FSDP cells; the harness's own Latin-square repeats are the experiment.
  # Twice: with the default GPU profiling of each cell's first repeat (2 steps) and with 0 (one CPU-only
  # profiled step): a profiler session's residue (1.02-1.09x with TEARDOWN_CUPTI=1 in the
  # profiler_aftereffect probe) would show as steadier cells in the second run (AF_PROFILE: which
  # runs, default "2 0")
  for prof in ${AF_PROFILE:-2 0}; do
    timeout 280 python3 -m bench run --no-progress --out "$R/after-p$prof" --workloads gpt-200m --global-batch 64 \
       --strategies "${AF_STRATS:-ddp,fsdp,pipeline-1f1b}" --backends nccl --world-sizes "${AF_WS:-2}" --repeats 6 \
       --steps 8 --warmup 3 --warmup-max 0 --steps-max 0 --budget off --profile-steps "$prof" --sample-hz 2 \
       $(case "${AF_STRATS:-pipeline}" in *pipeline*) echo --option micro_batches=8 --option pp_balance=blocks;; esac) \
       --cell-timeout 120 > "$OUT/after-p$prof.log" 2>&1
    python3 -m tools.baselines.order_effect "$(ls -d "$R/after-p$prof"/*/ | tail -n 1)" > "$OUT/order_effect-p$prof.txt" 2>&1
    echo "== profile steps $prof"; grep -v "^ " "$OUT/order_effect-p$prof.txt" | tail -n 4
  done ;;
trun)  # DDP and FSDP with the plain programs started by torchrun, as the harness's ranks are
  # (3 ABBA rounds, ${IL_WS:-4} GPUs)
  PYTHONPATH=. timeout 300 python3 tools/baselines/interleave.py --world-sizes "${IL_WS:-4}" --families ddp,fsdp \
     --repeats 3 --steps 8 --warmup 3 --launcher torchrun --harness-profile-steps 2 --deadline-s 290 --out "$OUT/trun" \
     > "$OUT/trun.log" 2>&1
  tail -n 5 "$OUT/trun.log"
  (cd "$OUT" && tar czf trun.tgz trun trun.log && rm -rf trun) ;;
gate) (  # a subshell: the GPU mask and positional parameters stay inside
  # G_GB (global batch), G_STRATS, G_WS: e.g. the GPU-bound variant of the A/B (the default cells
  # are launch-bound on a shared host, noise floors 21-77%): G_GB=64 G_STRATS=ddp,fsdp G_WS=2
  strats=${G_STRATS:-ddp,fsdp,pipeline-1f1b}
  rm -rf "$R"/gate-a1 "$R"/gate-b "$R"/gate-a2  # the pairs below take the latest run folder of each
  g=(--workloads "${G_WL:-gpt-200m}" --backends "${G_BE:-nccl}" --device "${G_DEV:-cuda}" --repeats 5
     --steps "${G_STEPS:-20}" --warmup 5 --warmup-max 0 --steps-max 0 ${G_GB:+--global-batch "$G_GB"}
     --budget off --profile-steps 0 --sample-hz 2 --cell-timeout 90)
  timeout 190 python3 -m bench run --no-progress --out "$R/gate-a1" --strategies "$strats" \
     --world-sizes "${G_WS:-2,4}" "${g[@]}" > "$OUT/gate-a1.log" 2>&1
  show gate-a1
  export CUDA_VISIBLE_DEVICES=0,1
  timeout 130 python3 -m bench run --no-progress --out "$R/gate-b" \
     --strategies "${strats/ddp/tests.regress_helpers:DDPSlowed}" --world-sizes 2 "${g[@]}" > "$OUT/gate-b.log" 2>&1
  timeout 130 python3 -m bench run --no-progress --out "$R/gate-a2" --strategies "$strats" \
     --world-sizes 2 "${g[@]}" > "$OUT/gate-a2.log" 2>&1
  unset CUDA_VISIBLE_DEVICES
  a1=$(ls -d "$R"/gate-a1/*/ | tail -n 1); b=$(ls -d "$R"/gate-b/*/ | tail -n 1); a2=$(ls -d "$R"/gate-a2/*/ | tail -n 1)
  for pair in "aa $a1 $a2" "ab $a1 $b" "ba2 $a2 $b"; do set -- $pair
    python3 -m bench compare "$2" "$3" --markdown "$OUT/compare-$1.md" --json "$OUT/compare-$1.json" \
       > "$OUT/compare-$1.txt" 2>&1; echo "compare $1: exit $?"; tail -n 12 "$OUT/compare-$1.txt"
  done
  # the device tool returns at most 8 files: logs, texts and JSON go back as one archive
  (cd "$OUT" && tar czf gate-logs.tgz gate-*.log compare-*.txt compare-*.json && rm -f gate-*.log compare-*.txt compare-*.json)
  ) ;;
budget)  # the default matrix (no options: every strategy, backend and world size the
  # GPUs allow) under its default 10-minute budget; the call's own 600 s limit is the budget's limit too
  start=$(date +%s)
  timeout 570 python3 -m bench run --no-progress --out "$R/budget" > "$OUT/budget.log" 2>&1
  echo "default matrix: exit $? after $(( $(date +%s) - start )) s"
  grep -iE "^budget" "$OUT/budget.log" | head -n 3
  # where each process group's start-up went (meta.json group_starts; written when the run ends)
  python3 - "$(ls -d "$R/budget"/*/ | tail -n 1)" <<'PY'
import json, sys
m = json.load(open(sys.argv[1] + "/meta.json"))
cols = ["torchrun_s", "imports_s", "device_s", "process_group_s", "placement_s", "warm_up_s", "to_first_cell_s",
        "start_s", "teardown_s"]
print("group      " + " ".join(f"{c[:-2][:9]:>9}" for c in cols))
for g in m.get("group_starts") or []:
    print(f"{g['group']:<10} " + " ".join(f"{g[c]:9.2f}" if c in g else f"{'-':>9}" for c in cols))
PY
  show budget | tail -n 12 ;;
four)
  pb four --workloads gpt-200m --strategies ddp,fsdp,pipeline-gpipe,pipeline-1f1b,tensor,dp-pp,fsdp-tp \
     --backends nccl --world-sizes 1,2,4 --steps 30 --warmup 5 --cell-timeout 150 > "$OUT/four.log" 2>&1
  show four ;;
esac
done
tar czf "$OUT/runs-$FIRST.tgz" -C "$R" . 2>/dev/null
for d in "$OUT"/i2 "$OUT"/i4 "$OUT"/il; do [ -d "$d/interleave-runs" ] && tar czf "$d-runs.tgz" -C "$d" interleave-runs && rm -rf "$d/interleave-runs"; done
ls -la "$OUT"
