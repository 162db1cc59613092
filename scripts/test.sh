#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the whole test suite for real: systemd test hosts,
# sshd, D-Bus and vLLM included. Extra arguments go to the second pytest run. --durations=40: every run
# (CI's log too) ends with the 40 slowest set-ups, calls and teardowns, where the suite's time goes.
#
# A fast lane first (about a minute): ruff (lint, and format --check: one layout, no style review), mypy --strict (pyproject's [tool.mypy]), the layer contracts
# (lint-imports), tests/unit and the docs site (mkdocs build --strict into a temporary directory: no
# tracked file written; not -q, which hides the warnings --strict fails on), so a type, layer or docs
# error fails before the ~30 minutes of host tests.
# set -e stops at the first failure, so the last runner line of the log is always the one that failed;
# the host run then leaves tests/unit out (they ran, and passed, in the fast lane).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
lane() { printf '[fast lane] %s\n' "$*"; "$@"; }
lane .venv/bin/ruff check .
lane .venv/bin/ruff format --check .
lane .venv/bin/mypy --strict
lane .venv/bin/lint-imports --no-cache
lane .venv/bin/python -m pytest -q -p no:cacheprovider tests/unit
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 lane .venv/bin/mkdocs build --strict -d "$site"
rm -rf "$site"
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=40 --ignore=tests/unit "$@" tests
