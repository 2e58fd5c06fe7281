"""arag: adaptive retrieval-augmented generation methods and their baselines as DSPy programs.

    import dspy, arag
    dspy.configure(lm=arag.build_lm("openai/gpt-4o-mini"))
    retriever = arag.open_retriever(corpus="corpus.jsonl")          # BM25, built once and cached
    program = arag.build_program("single-rag", retriever, k=5)
    print(program(question="Who wrote Hamlet?").answer)
    result = arag.evaluate(program, arag.load_examples("dev.jsonl"), out_dir="runs/dev", threads=8)
    spec = arag.RunSpec(program="flare", params={"theta": 0.6}, lm="openai/gpt-4o-mini", corpus="corpus.jsonl")
    spec.evaluate(arag.load_examples("dev.jsonl"), out_dir="runs/flare", dataset="dev.jsonl")  # validated once
    compiled = arag.compile(program, arag.load_examples("train.jsonl"), teleprompter="bootstrap")
    arag.save(compiled, "single-rag.json"); program = arag.load("single-rag.json", retriever)
    space = arag.SearchSpace(ranges={"k": (1, 12)}, fixed={"reasoning": "direct"})
    tuned = arag.tune("single-rag", arag.load_examples("dev.jsonl"), retriever,      # Optuna: 20 trials of k
                      arag.TuningConfig(trials=20, out_dir="runs/tune", objectives=("f1",), space=space))
    print(tuned.best["params"])
    arag.report(["runs/dev", "runs/other"], "report.html")         # one HTML page comparing runs (`report` extra)
"""

from arag.data import load_corpus, load_examples
from arag.errors import AragError, ConfigError, DataError, FolderInUse, LMError, RetrieverError
from arag.evaluate import evaluate
from arag.lm import build_lm, field_logprobs, label_probabilities
from arag.optimizers import compile, load_program, save_program
from arag.optimizers.tuning import SearchSpace, TuningConfig, tune
from arag.passages import Passage
from arag.programs import PROGRAMS, RAGProgram, build_program, get_program
from arag.report import report
from arag.retrievers import open_retriever
from arag.setup import LMSetup, RunSpec

save = save_program
load = load_program

__all__ = [
    "PROGRAMS",
    "AragError",
    "ConfigError",
    "DataError",
    "FolderInUse",
    "LMError",
    "LMSetup",
    "Passage",
    "RAGProgram",
    "RetrieverError",
    "RunSpec",
    "SearchSpace",
    "TuningConfig",
    "build_lm",
    "build_program",
    "compile",
    "evaluate",
    "field_logprobs",
    "get_program",
    "label_probabilities",
    "load_corpus",
    "load",
    "load_examples",
    "load_program",
    "open_retriever",
    "report",
    "save",
    "save_program",
    "tune",
]
