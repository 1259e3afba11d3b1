#!/usr/bin/env bash
# The memory model against the measured peak on one GPU: single-device cells of GPT sizes from
# gpt-50m to 7.7B parameters (and an HF llama), SGD and AdamW, checkpointing none and full, two
# global batches each. Usage (repository root):
#   OUT=DIR bash tools/device/memory.sh PHASE [PHASE...]
#   small   gpt-50m, gpt-200m and a 1.3B GPT (gpt-20b's shape, 2 layers) and hf:llama (0.5B)
#   large   4.0B (8 layers) and 7.7B (16 layers)
# Each phase is one `parbench run` (within MEM_TIMEOUT s, default 560); its table goes to $OUT/memory-PHASE.csv (tools/memory_table.py)
# and is printed last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/parbench-out}; R=/tmp/pb-memory; mkdir -p "$OUT" "$R"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpus.csv"
LLAMA="hf:llama[hidden_size=1536,num_hidden_layers=12,intermediate_size=4096,num_attention_heads=12,num_key_value_heads=4,vocab_size=32000,seq_len=1024"
for phase in "$@"; do
  case "$phase" in
  small) wls="gpt-50m[global_batch=16],gpt-50m[global_batch=64],gpt-200m[global_batch=8],gpt-200m[global_batch=32]"
         wls="$wls,gpt-20b[n_layer=2,global_batch=4],gpt-20b[n_layer=2,global_batch=16],$LLAMA,global_batch=4],$LLAMA,global_batch=16]" ;;
  large) wls="gpt-20b[n_layer=8,global_batch=2],gpt-20b[n_layer=8,global_batch=8],gpt-20b[n_layer=16,global_batch=1],gpt-20b[n_layer=16,global_batch=4]" ;;
  *) echo "unknown phase $phase"; exit 2 ;;
  esac
  timeout "${MEM_TIMEOUT:-560}" python3 -m bench run --no-progress --out "$R/$phase" --workloads "$wls" --strategies single \
    --world-sizes 1 --optimizer sgd,adamw --ac none,full --steps 3 --warmup 2 --warmup-max 0 --steps-max 0 \
    --repeats 1 --profile-steps 0 --sample-hz 0 --budget off > "$OUT/$phase.log" 2>&1 || tail -8 "$OUT/$phase.log"
  grep -i "probe" "$OUT/$phase.log" | head -5
  python3 -m tools.memory_table "$(ls -d "$R/$phase"/*/ | tail -n 1)" --csv "$OUT/memory-$phase.csv"
done
