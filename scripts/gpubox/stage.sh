#!/usr/bin/env bash
# stage.sh: HERE, as root, once. Stages everything the GPU-box run needs into .gpu/ (ignored) and splits it
# into one folder per device call, each small enough to travel beside the tracked tree (a call carries 64 MiB
# in all):
#   .gpu/box/        stage.tgz + manifest.json (Debian packages: scripts/gpubox/debs.sh), client key,
#                    wheels/ (the product's wheel + every dependency for the box's python3.11: cp311),
#                    vllm/ (vLLM 0.25.1 for the H200's Python 3.12 + torch: ../shared/tools/gpu-vllm/pack.sh)
#   .gpu/c1 .. cN    the same files cut into parts of at most CAP bytes; `there.sh recv` puts them together
# Then prints the device calls to make, back to back (the machine is given back 30 s after a call ends).
#   bash scripts/gpubox/stage.sh            # again: only what changed (the product's wheel) is rebuilt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
G=${G:-$repo/.gpu/box}; VLLM_TOOLS=${VLLM_TOOLS:-$repo/../shared/tools/gpu-vllm}
PY=${PY:-$repo/.venv/bin/python}
mkdir -p "$G"
say() { echo "[stage $(date +%T)] $*"; }

if [ ! -s "$G/stage.tgz" ] || [ "${REDO_DEBS:-0}" = 1 ]; then
  say "Debian packages (debs.sh)"; G=$G bash "$here/debs.sh"
fi

say "the product's wheel and its dependencies for python3.11 (the box's)"
rm -rf "$G/wheels.new" && mkdir -p "$G/wheels.new"
"$PY" -m pip wheel -q --no-deps -w "$G/wheels.new" "$repo" 2>&1 | grep -v "is ignored" || true
whl=$(ls "$G"/wheels.new/orchestrator-*.whl)
# every dependency as a wheel for this machine's Python (3.11, x86_64, glibc 2.36: Debian 12, as the box);
# sdist-only ones (sdnotify, pydbus) are built into wheels here
"$PY" -m pip wheel -q -w "$G/wheels.new" "$whl" pydbus 2>&1 | grep -v "is ignored" || true
rm -rf "$G/wheels" && mv "$G/wheels.new" "$G/wheels"
say "wheels: $(ls "$G/wheels" | wc -l) files, $(du -sh "$G/wheels" | cut -f1)"

if [ ! -s "$G/vllm/payload.sha256" ]; then
  say "vLLM for the GPU machine ($VLLM_TOOLS/pack.sh: downloads ~140 MB)"
  bash "$VLLM_TOOLS/pack.sh" "$G/vllm.tmp"
  mkdir -p "$G/vllm" && cat "$G"/vllm.tmp/p*/part.* > "$G/vllm/payload.tar.xz"
  cp "$G/vllm.tmp/payload.sha256" "$G/vllm/" && rm -rf "$G/vllm.tmp"
  (cd "$G/vllm" && sha256sum -c payload.sha256)
fi

say "one bundle, cut into per-call parts"
tree=$(git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && xargs -0 stat -c %s 2>/dev/null) \
       | awk '{s += $1} END {print s}')
CAP=${CAP:-$(( 64 * 1048576 - tree - 3 * 1048576 ))}   # 3 MiB for what changes in the tree before the calls
rm -rf "$repo"/.gpu/c[0-9]* "$G/bundle.tar"
tar -C "$G" -cf "$G/bundle.tar" stage.tgz manifest.json client_ed25519 client_ed25519.pub wheels vllm/payload.tar.xz vllm/payload.sha256
(cd "$G" && sha256sum bundle.tar > bundle.sha256)
split -b "$CAP" -d -a 1 "$G/bundle.tar" "$G/bundle.part."
n=0; for p in "$G"/bundle.part.*; do n=$((n+1)); mkdir -p "$repo/.gpu/c$n"; mv "$p" "$repo/.gpu/c$n/"; done
cp "$G/bundle.sha256" "$repo/.gpu/c$n/"
rm -f "$G/bundle.tar"
say "tree $(( tree / 1048576 )) MiB; $n parts of at most $(( CAP / 1048576 )) MiB:"
for i in $(seq 1 $n); do echo "  .gpu/c$i $(du -sh "$repo/.gpu/c$i" | cut -f1)"; done
cat <<EOF
Device calls, back to back (each within 30 s of the last; run(carry=[...], command=...)):
$(for i in $(seq 1 $n); do echo "  carry [\".gpu/c$i\"]  command: bash scripts/gpubox/there.sh recv"; done)
  then:                  command: bash scripts/gpubox/there.sh up       (unpack, boot, models, agent install)
  then:                  command: bash scripts/gpubox/there.sh run A    (cold, cold, warm switches)
  then:                  command: bash scripts/gpubox/there.sh run B    (rollback, wedge, kills, stop) and down
EOF
