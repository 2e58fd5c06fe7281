#!/usr/bin/env bash
# Set up .venv with arag, its optional retrievers and its test dependencies on a fresh machine,
# then check the code with ruff, build the documentation site (strict) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
# `arag` on PyPI is another project with an `arag` command (and this one's name before dspy-arag): remove it first.
if .venv/bin/python -m pip show -q arag >/dev/null 2>&1; then .venv/bin/python -m pip uninstall -q -y arag; fi
# The CPU build first: a plain `torch` requirement would pull gigabytes of CUDA packages.
pip_install "torch==2.13.0"
# `local` compiles llama.cpp on a fresh machine (about 4 to 12 minutes on 2 cores; pip caches the wheel).
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" pip_install -e ".[test,dense,dense-torch,colbert,tune,local,report,router,milvus,lucene,attention,docs]"
# Chromium for the report's browser test, which is skipped without it (root with apt only; never fatal).
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null && ! command -v chromium >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "could not install chromium: the report's browser test will be skipped" >&2
fi
# A PostgreSQL server on loopback for the test of several tuning workers on one study (root with apt only).
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  ARAG_TEST_POSTGRES_URL="$(bash scripts/start-postgres.sh)" && export ARAG_TEST_POSTGRES_URL
fi
.venv/bin/ruff check .
# The site, into site/: a broken link, a page left out of the navigation or a generated page that fails stops here.
NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true .venv/bin/mkdocs build --strict --quiet
exec .venv/bin/python -m pytest -q "$@"
