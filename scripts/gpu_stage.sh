#!/usr/bin/env bash
# Stage this checkout's code for the device tool: its `run` sends the checkout the SESSION started in
# (not a helper's worktree), and `carry` names ignored paths inside that checkout. So the code the H200
# run needs goes into DEST (an ignored folder of that checkout, e.g. /work/main/.gpu/gpu2) and the run
# carries it: code/{orchestrator,scripts,bench} and whl/ (the wheels gpu_run.sh unpacks).
#   bash scripts/gpu_stage.sh DEST WHL_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd); dest=$1; whl=$2
rm -rf "$dest" && mkdir -p "$dest/code/bench/loadgen" "$dest/whl"
cp -rL "$src/orchestrator" "$src/scripts" "$dest/code/"  # -L: _templates is a link, and links travel as links
cp "$src/bench/loadgen/vllm_compare.py" "$dest/code/bench/loadgen/"
cp "$whl"/*.whl "$dest/whl/"
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
echo "staged $(git -C "$src" rev-parse --short HEAD)$(git -C "$src" diff --quiet || echo +dirty) in $dest: $(du -sh "$dest" | cut -f1)"
