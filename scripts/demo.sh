#!/usr/bin/env bash
# Set up everything (scripts/setup.sh), boot a local systemd test host and switch real vLLM models
# on it: tiny-a -> tiny-b -> tiny-broken (rolls back to tiny-b); then status and history.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py
