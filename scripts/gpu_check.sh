#!/usr/bin/env bash
# Run a 3-trial study against real vLLM on this machine's NVIDIA GPU, then print each
# trial's StartupReport and score. CI never runs this; run it by hand on a GPU box:
#
#   bash scripts/gpu_check.sh                        # Qwen/Qwen2.5-0.5B-Instruct
#   MODEL=/models/llama-3.1-8b VLLM=/opt/vllm/bin/vllm bash scripts/gpu_check.sh
#
# Needs: nvidia-smi, vLLM (>= 0.11, for --kv-cache-memory-bytes), autotune installed,
# the model downloadable or local. Leaves its study under $OUT (default: a temp dir).
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
VLLM="${VLLM:-vllm}"
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d -t autotune-gpu-check.XXXXXX)}"

command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: not a GPU machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
command -v "$VLLM" >/dev/null || [ -x "$VLLM" ] || { echo "gpu_check: vLLM executable '$VLLM' not found" >&2; exit 2; }

cat >"$OUT/space.yaml" <<YAML
name: gpu-check
model: $MODEL
parameters:
  kv_cache_memory_gib: {type: float, low: 2.0, high: 6.0, step: 2.0, unit: GiB, flag: kv-cache-memory-bytes}
  max_num_seqs: {type: int, low: 16, high: 64, step: 16, flag: max-num-seqs}
fixed:
  max-model-len: 4096
baseline: {kv_cache_memory_gib: 4.0, max_num_seqs: 32}
YAML

"$PYTHON" - "$OUT/workload.jsonl" <<'PY'
import sys
from pathlib import Path
from autotune.workload.gen import fixed
from autotune.workload.io import write_workload
w = fixed(requests=64, prompt_tokens=512, output_tokens=128)
write_workload(Path(sys.argv[1]), [w.header, *w.requests])
PY

autotune run --engine vllm --vllm-executable "$VLLM" --model "$MODEL" \
  --space "$OUT/space.yaml" --workload "$OUT/workload.jsonl" --trials 3 --sampler grid \
  --mode concurrency --concurrency 16 --startup-timeout 15m \
  --storage "sqlite:///$OUT/gpu.db" --study gpu-check

"$PYTHON" - "sqlite:///$OUT/gpu.db" <<'PY'
import json, sys
import optuna
study = optuna.load_study(study_name="gpu-check", storage=sys.argv[1])
print("engine", study.user_attrs.get("engine_version"), "on", json.dumps(study.user_attrs.get("hardware")))
for trial in study.trials:
    attrs = trial.user_attrs
    print(f"\ntrial {trial.number}: {trial.params} -> {attrs.get('outcome')} value={trial.value}")
    print("  startup:", json.dumps(attrs.get("startup")))
    if attrs.get("failure"):
        print("  failure:", attrs["failure"]["failure_class"], attrs["failure"]["message"])
PY
echo "study and server logs kept in $OUT"
