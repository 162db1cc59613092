#!/usr/bin/env bash
# The H200 run of scripts/engine_check.py, as the device tool ran it (CONTRIBUTING.md: "Real vLLM on a GPU").
# Expects: this repo's orchestrator/, scripts/, bench/ and whl/ (pure-Python wheels the machine lacks:
# structlog, pydantic-settings, python-dotenv, croniter) beside it in CODE (default: this script's
# folder's parent), vLLM 0.25.1 parts in PARTS (../shared/tools/gpu-vllm/pack.sh), and writes under OUT.
#   OUT=/tmp/out PARTS=/root/parts [WHL=dir] [MODEL=m13] [MODELS="m8 m1"] bash scripts/gpu_run.sh [engine_check.py flags...]
#   (flag values that start with "--" need "=": --first-args=--no-enable-prefix-caching --second-args=)
# whl/: pip download --no-deps --only-binary=:all: -d whl structlog==26.1.0 pydantic-settings==2.16.3 \
#       python-dotenv==1.2.4 croniter==7.0.0
set -uo pipefail
CODE=${CODE:-$(cd "$(dirname "$0")/.." && pwd)}
PARTS=${PARTS:-/root/parts}
: "${OUT:?set OUT}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
t0=$(date +%s)
stamp() { echo "[gpu_run +$(( $(date +%s) - t0 ))s] $*"; }
if [ ! -d /root/p/site/vllm ]; then
  stamp "unpacking vLLM from $PARTS"
  bash "$PARTS/unpack.sh" "$PARTS" /root/p || exit 3
fi
WHL=${WHL:-$CODE/whl}
MODEL=${MODEL:-m8}              # the model engine_check serves (scripts/make_gpu_model.py --size)
MODELS=${MODELS:-$MODEL}        # every model to make (the warm part also needs m1)
mkdir -p /root/site2 && for w in "$WHL"/*.whl; do python3 -m zipfile -e "$w" /root/site2; done
sizes=(); for m in $MODELS; do [ -f "/root/models/$m/config.json" ] || sizes+=(--size "$m"); done
if [ ${#sizes[@]} -gt 0 ]; then
  stamp "making $MODELS (random weights) on the GPU"
  python3 "$CODE/scripts/make_gpu_model.py" /root/models "${sizes[@]}" || exit 3
  df -h /root | tail -1
fi
export PYTHONPATH=/root/p/site:/root/site2:$CODE
stamp "engine_check"
timeout -s INT "${CHECK_TIMEOUT:-520}" python3 "$CODE/scripts/engine_check.py" --model-dir "/root/models/$MODEL" --served-name "$MODEL" --port 8001 \
  --engine "$(command -v python3) -m vllm.entrypoints.openai.api_server" --gpu-memory-utilization 0.85 \
  --env VLLM_USE_FLASHINFER_SAMPLER=0 --env HF_HUB_OFFLINE=1 --env VLLM_NO_USAGE_STATS=1 \
  --out "$OUT/run" "$@"
rc=$?
stamp "engine_check exit $rc"
tar -C "$OUT" -czf "$OUT/run.tar.gz" run && rm -rf "$OUT/run"
exit $rc
