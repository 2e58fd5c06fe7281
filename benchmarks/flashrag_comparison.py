"""The quality matrix's F1 beside FlashRAG's published table, for the methods both run.

FlashRAG (Jin et al., 2024; its README's "Supporting Methods" table) ran each method with Llama3-8B-instruct, the
e5-base-v2 retriever over the December 2018 Wikipedia dump (21M passages of 100 words), 5 passages a retrieval,
on 1,000 questions sampled from each dataset's test or dev split. This matrix runs Qwen2.5-Coder-1.5B-Instruct
(Q4_K_M) with BM25 over each dataset's own paragraphs, on the table's questions (PopQA: the long-tail questions
that carry passages). So the columns compare what each method does relative to single-rag and closed-book
answering on the same model, not the numbers themselves.

    python benchmarks/flashrag_comparison.py [--model qwen2.5-coder-1.5b] [--results DIR]

prints a Markdown table: each method's F1 × 100 in FlashRAG and here, with n, and here its difference from
single-rag on the same questions with its 95 % paired bootstrap interval.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quality_plan import DATASETS, table_questions
from quality_results import cell_rows

from arag.runs.table import paired_difference, question_scores

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "datasets"
SOURCE = "https://github.com/RUC-NLPIR/FlashRAG#supporting-methods"
COLUMNS = ("hotpotqa", "2wiki", "popqa")
# FlashRAG's F1 on HotpotQA, 2WikiMultihopQA and PopQA, by the program of this package that runs the method.
FLASHRAG_F1 = {
    "no-retrieval": (28.4, 33.9, 21.7),  # "Naive Generation"
    "single-rag": (35.3, 21.0, 36.7),  # "Standard RAG"
    "flare": (28.0, 33.9, 20.7),
    "iter-retgen": (38.3, 21.6, 37.9),
    "ircot": (41.5, 32.4, 45.6),
    "self-rag": (29.6, 25.1, 32.7),  # FlashRAG runs the trained selfrag-llama2-7B
    "sure": (33.4, 20.6, 48.1),
    "adaptive-rag": (39.1, 28.4, 40.4),
}
BASELINE = "single-rag"


def ours(results: Path, shared: Path, program: str, dataset: str) -> str:
    """The program's F1 × 100 on the table's questions it answered, with n and its difference from single-rag."""
    examples = table_questions(DATASETS[dataset], shared, len(DATASETS[dataset].questions(shared)))
    rows = cell_rows(results, dataset, program, examples)
    if not rows:
        return "—"
    f1 = 100 * sum(row.metrics.get("f1", 0.0) for row in rows) / len(rows)
    if program == BASELINE:
        return f"{f1:.1f} (n {len(rows)})"
    difference = paired_difference(question_scores(rows, "f1"), question_scores(
        cell_rows(results, dataset, BASELINE, examples), "f1"))
    versus = (f", {100 * difference.mean:+.1f} [{100 * difference.low:+.1f}, {100 * difference.high:+.1f}]"
              if difference else "")
    return f"{f1:.1f} (n {len(rows)}{versus})".replace("-", "−")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="the results' model folder")
    parser.add_argument("--results", type=Path, help="the results (default benchmarks/results/quality/MODEL)")
    parser.add_argument("--shared", type=Path, default=SHARED, help="the shared datasets folder")
    args = parser.parse_args()
    results = args.results or ROOT / "benchmarks" / "results" / "quality" / args.model
    if not results.is_dir():
        sys.exit(f"no quality results at {results}")
    labels = [DATASETS[dataset].label for dataset in COLUMNS]
    print("| method | " + " | ".join(f"{label}: FlashRAG | {label}: here" for label in labels) + " |")
    print("|---" * (1 + 2 * len(COLUMNS)) + "|")
    for program, published in FLASHRAG_F1.items():
        cells = [f"{value:.1f} | {ours(results, args.shared, program, dataset)}"
                 for value, dataset in zip(published, COLUMNS)]
        print(f"| {program} | " + " | ".join(cells) + " |")
    print(f"\nFlashRAG: F1 × 100, Llama3-8B-instruct, e5-base-v2 over Wikipedia (2018), 1,000 questions a dataset "
          f"({SOURCE}). Here: F1 × 100 of {args.model} with BM25 over each dataset's own paragraphs, n questions, "
          "and in brackets the difference from single-rag on the same questions with its 95 % interval.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
