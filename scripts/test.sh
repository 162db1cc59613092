#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the whole test suite for real: systemd test hosts,
# sshd, D-Bus and vLLM included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
