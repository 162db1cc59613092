#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the whole test suite for real: systemd test hosts,
# sshd, D-Bus and vLLM included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two workers (TEST_WORKERS): most of a host test is waiting on systemd, sshd and engines, so two
# share the two cores well; tests/conftest.py keeps each module on one worker and every real-vLLM
# module on the same one.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" --dist loadgroup "$@" tests
