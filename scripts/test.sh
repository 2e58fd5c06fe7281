#!/usr/bin/env bash
# Set up .venv with arag and its test dependencies on a fresh machine, then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
exec .venv/bin/python -m pytest -q "$@"
