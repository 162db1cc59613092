#!/bin/bash
# box_setup.sh: INSIDE the booted box (root, through cx.sh), after boot. Puts the product on the box the README's
# way: a CLI venv from the carried wheels, then
#   orchestrator agent install ssh://root@127.0.0.2:2222 --config /wlogs/in/deploy.toml ...
# and checks that a second install has nothing to do. Inputs under /wlogs/in: deploy.toml, deps/ (cp311
# wheels), orchestrator-*.whl. Derived from ../shared/tools/gpu-box/box_setup.sh.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
t0=$(date +%s.%N); el() { awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN{printf "%.1f", b-a}'; }
say() { echo "[setup +$(el)s] $*"; }
IN=/wlogs/in
say "ldconfig"; ldconfig; ldconfig -p | grep -E 'libcuda\.so\.1|libnvidia-ml\.so\.1' | sed 's/^/  /'
if [ "${GPUBOX_DRY:-0}" = 1 ]; then  # the stand-in nvidia-smi: one H200's worth of memory
  mkdir -p /run/standin-gpu && chmod 1777 /run/standin-gpu
  echo '{"count": 1, "memory_mib": 143771, "name": "NVIDIA H200"}' > /run/standin-gpu/gpus.json
fi
say "nvidia-smi: $(command -v nvidia-smi)"; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
say "python3.11: $(python3.11 -c 'import gi, venv, ensurepip, sys; print(sys.version.split()[0], "gi", gi.__version__)' 2>&1)"
if [ "${GPUBOX_DRY:-0}" != 1 ]; then  # the engine as its unit's user will run it: a wrong path fails here, not mid-switch
  say "engine as vllm: $(runuser -u vllm -- env PYTHONPATH=/opt/vllm/site /opt/torch/.venv/bin/python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1)"
fi
say "CLI venv /opt/orch-cli"
python3.11 -m venv --system-site-packages /opt/orch-cli || { echo "SETUP FAILED venv"; exit 1; }
PIP_CONFIG_FILE=/dev/null /opt/orch-cli/bin/python -m pip install -q --no-index --no-cache-dir --disable-pip-version-check \
  --find-links $IN/deps $IN/orchestrator-*.whl pydbus || { echo "SETUP FAILED cli pip"; exit 1; }
say "CLI: $(/opt/orch-cli/bin/orchestrator --version 2>&1 | head -1)"
install -d -m 700 /root/.ssh
for i in $(seq 1 50); do ssh-keyscan -p 2222 127.0.0.2 2>/dev/null > /root/.ssh/known_hosts; [ -s /root/.ssh/known_hosts ] && break; sleep 0.2; done
say "known_hosts: $(cut -c1-60 /root/.ssh/known_hosts | head -1)"
install() {
  /opt/orch-cli/bin/orchestrator agent install ssh://root@127.0.0.2:2222 --config $IN/deploy.toml \
    --key /root/.ssh/gsd_client_ed25519 --known-hosts /root/.ssh/known_hosts --python /usr/bin/python3.11 \
    --wheel "$(ls $IN/orchestrator-*.whl)" --wheelhouse $IN/deps
}
say "== orchestrator agent install (the README's way)"
install; rc=$?
echo "RESULT agent_install rc=$rc t=$(el)"
if [ $rc != 0 ]; then journalctl -u orchestrator-agent -n 50 --no-pager; exit $rc; fi
say "== second install (README: 'nothing to do')"
install; echo "RESULT agent_install_again rc=$? t=$(el)"
systemctl status orchestrator-agent --no-pager | head -8
say "done"
