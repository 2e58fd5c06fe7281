#!/usr/bin/env bash
# Set up .venv with arag, then evaluate single-time RAG on the bundled sample set.
# The LM comes from ARAG_LM (default openai/gpt-4o-mini, key in OPENAI_API_KEY) and, for a local
# OpenAI-compatible server (vLLM, Ollama, llama.cpp), ARAG_API_BASE=http://HOST:PORT/v1.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/arag eval --program "${PROGRAM:-single-rag}" \
  --dataset data/sample/questions.jsonl --corpus data/sample/corpus.jsonl \
  --lm "${ARAG_LM:-openai/gpt-4o-mini}" --out "${OUT:-runs/sample}" "$@"
