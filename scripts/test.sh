#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the whole test suite for real: systemd test hosts,
# sshd, D-Bus and vLLM included. Extra arguments go to pytest. --durations=40: every run (CI's log too)
# ends with the 40 slowest set-ups, calls and teardowns, where the suite's time goes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=40 "$@" tests
