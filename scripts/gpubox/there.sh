#!/usr/bin/env bash
# there.sh: THERE (the lent GPU machine, root; or here for a dry run, see DRY below). One verb a device call:
#   recv        keep the carried .gpu/cN parts in $W (the machine keeps them while it stays warm)
#   up          put the parts together (sha256), unpack vLLM to /opt/vllm, make the models, boot the systemd
#               box (boot.sh), install the agent inside it the README's way (box_setup.sh)
#   run PART    run scenario.py PART inside the box (client prober through HAProxy, every step's status,
#               history and nvidia-smi); the raw results come back as $OUT/PART.tar.gz
#   down        power the box off, GPU free, unmount (teardown.sh)
# Knobs: W (work folder, /root/gpubox), MODELS_DIR (/srv/models), DRY=1 (here without a GPU: stand-in engine
# and nvidia-smi, private network), GPUBOX_PYTHON_KEY=1 (write hosts.box.python into the box's deploy.toml).
# Part F only: GPUBOX_FLOOR (warm switches, 6), GPUBOX_DOCTOR=0 (leave doctor out when device time is short).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
W=${W:-/root/gpubox}; MODELS_DIR=${MODELS_DIR:-/srv/models}; DRY=${DRY:-0}
export STATE=$W/state.env WLOGS=$W/wlogs LOGDIR=$W/logs
OUT=${OUT:-$W/out}
t0=$(date +%s.%N); say() { echo "[there +$(awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN{printf "%.1f", b-a}')s] $*"; }
mkdir -p "$W/parts" "$WLOGS" "$LOGDIR" "$OUT"

recv() {
  local n=0
  for p in "$repo"/.gpu/c*/*; do [ -f "$p" ] && cp "$p" "$W/parts/" && n=$((n+1)); done
  say "kept $n files; $W/parts now: $(ls "$W/parts" | tr '\n' ' ')"
}

up() {
  set -e
  local G=$W/G
  if [ ! -s "$G/stage.tgz" ]; then
    say "bundle: $(ls "$W"/parts/bundle.part.* | wc -l) parts"
    cat "$W"/parts/bundle.part.* > "$W/bundle.tar"
    (cd "$W" && sha256sum -c "$W/parts/bundle.sha256")
    mkdir -p "$G" && tar -C "$G" -xf "$W/bundle.tar" && rm -f "$W/bundle.tar"
  fi
  if [ "$DRY" = 1 ]; then
    say "dry run: stand-in engine and nvidia-smi"
  else
    if [ ! -d /opt/vllm/site/vllm ]; then
      say "vLLM: unpacking to /opt/vllm (readable by the vllm user; /root is 0700)"
      mkdir -p /opt/vllm && (cd "$G/vllm" && sha256sum -c payload.sha256)
      tar -C /opt/vllm -xJf "$G/vllm/payload.tar.xz" && chmod -R a+rX /opt/vllm
    fi
    if [ ! -f "$MODELS_DIR/m1/config.json" ] || [ ! -f "$MODELS_DIR/m8/config.json" ]; then
      say "models m8 (13 GiB) and m1 (1.4 GiB), random weights, made on the GPU"
      PYTHONPATH=/opt/vllm/site python3 "$repo/scripts/make_gpu_model.py" "$MODELS_DIR" --size m8 --size m1
      chmod -R a+rX "$MODELS_DIR"
    fi
  fi
  # what the box's setup reads under /wlogs/in: the wheels, the deploy.toml, the scenario
  rm -rf "$WLOGS/in" && mkdir -p "$WLOGS/in" "$WLOGS/out"
  cp -r "$G/wheels" "$WLOGS/in/deps" && mv "$WLOGS"/in/deps/orchestrator-*.whl "$WLOGS/in/"
  cp "$here"/box_setup.sh "$here"/scenario.py "$here"/prober.py "$WLOGS/in/"
  cp "$repo/bench/gpu_probe/bench.py" "$WLOGS/in/gpu_probe_bench.py"
  local gpus; if [ "$DRY" = 1 ]; then gpus=1; else gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l); fi
  DRY=$DRY GPUS=$gpus MODELS_DIR=$MODELS_DIR REPO=$repo PYKEY=${GPUBOX_PYTHON_KEY:-0} \
    python3 "$here/box_config.py" > "$WLOGS/in/deploy.toml"
  say "deploy.toml for the box ($gpus GPU):"; sed 's/^/  /' "$WLOGS/in/deploy.toml"
  set +e
  if [ ! -s "$STATE" ] || ! { . "$STATE"; kill -0 "$L" 2>/dev/null; }; then
    local extra=(); [ "$DRY" = 1 ] && extra=(PRIVNET=1 "FAKE_NVSMI=$repo/tests/standin/nvidia_smi.py")
    env G="$G" R=/mnt/gpubox "${extra[@]}" bash "$here/boot.sh" || return 1
  fi
  . "$STATE"
  # the container lacks CAP_SYS_RESOURCE: the open-files hard limit is 20000, so units may not ask for more
  mkdir -p "$M/etc/systemd/system/vllm-.service.d"
  printf '[Service]\nLimitNOFILE=20000\n' > "$M/etc/systemd/system/vllm-.service.d/gpubox.conf"
  [ "$DRY" = 1 ] && printf '[Service]\nEnvironment=STANDIN_GPU_DIR=/run/standin-gpu\n' \
    > "$M/etc/systemd/system/vllm-.service.d/standin.conf"
  if [ "$DRY" = 1 ]; then  # the agent reads the stand-in's GPU through NVML, as it reads a real one's
    mkdir -p "$M/usr/local/lib/standin-nvml" "$M/etc/systemd/system/orchestrator-agent.service.d"
    gcc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o "$M/usr/local/lib/standin-nvml/libnvidia-ml.so.1" \
      "$repo/tests/standin/fake_nvml.c" || return 1
    printf '[Service]\nEnvironment=STANDIN_GPU_DIR=/run/standin-gpu LD_LIBRARY_PATH=/usr/local/lib/standin-nvml\n' \
      > "$M/etc/systemd/system/orchestrator-agent.service.d/standin.conf"
  fi
  bash "$here/cx.sh" systemctl daemon-reload
  say "box_setup.sh (inside): CLI venv, agent install ssh://root@127.0.0.2:2222"
  CXENV="GPUBOX_DRY=$DRY" bash "$here/cx.sh" bash /wlogs/in/box_setup.sh 2>&1 | tee "$WLOGS/out/box_setup.log"
  local rc=${PIPESTATUS[0]}
  say "up: exit $rc"
  return "$rc"
}

run() {
  local part=$1
  . "$STATE"
  say "scenario $part"
  # bounded, so that the results come back inside the device call whatever the scenario does
  CXENV="PYTHONUNBUFFERED=1 GPUBOX_DRY=$DRY GPUBOX_FLOOR=${GPUBOX_FLOOR:-6} GPUBOX_DOCTOR=${GPUBOX_DOCTOR:-1}" timeout "${RUN_TIMEOUT_S:-540}" bash "$here/cx.sh" /opt/orch-cli/bin/python /wlogs/in/scenario.py "$part" /wlogs/out \
    2>&1 | tee "$WLOGS/out/scenario-$part.log"
  local rc=${PIPESTATUS[0]}
  collect "$part"
  return "$rc"
}

collect() {
  local part=$1
  . "$STATE"
  # the units' journals, the agent's and the proxy's: what each engine said (vLLM's own timings)
  for u in orchestrator-agent orchestrator-proxy $(bash "$here/cx.sh" systemctl list-units --all --plain --no-legend 'vllm-*' | awk '{print $1}'); do
    bash "$here/cx.sh" journalctl -u "$u" --no-pager -o short-precise > "$WLOGS/out/journal-$u.log" 2>&1
  done
  [ "$DRY" = 1 ] || nvidia-smi > "$WLOGS/out/nvidia-smi-host.txt" 2>&1
  tar -C "$WLOGS" -czf "$OUT/$part.tar.gz" out
  say "results: $OUT/$part.tar.gz ($(du -h "$OUT/$part.tar.gz" | cut -f1))"
}

down() { bash "$here/teardown.sh"; }

case "${1:-}" in
  recv) recv ;;
  up) up ;;
  run) run "${2:?run PART}" ;;
  collect) collect "${2:?collect PART}" ;;
  down) down ;;
  *) echo "usage: there.sh recv|up|run PART|collect PART|down" >&2; exit 2 ;;
esac
