"""Distillation data for GenGround's instructed grounding: the grounding calls of an evaluation run as a
chat fine-tuning set, so a small model can learn to ground the way a strong one did.

Each grounding call becomes one JSONL line in OpenAI's chat fine-tuning format, `{"messages": [system,
user, assistant]}`, holding exactly the prompt the run's adapter sent to the grounding step (arag's
SchemaAdapter, or its TextAdapter for a run made with --no-schema) and the answer the model gave; a
fine-tuned model then serves the same program unchanged. A `metadata` object on each line says where the
call came from, whether the run's final answer to that question was right, and which of the flaws below
the call has.

The paper distils only good grounding traces; per-call filters drop the calls with a flaw, each filter off by
default. `paper_filters` (`--paper-filters` on the command line) turns on the paper's three, all but
unrevised: the paper keeps a grounding that confirmed the candidate answer. The flaws:
- malformed (`drop_malformed`): the output lacks `evidence` or `revised_answer`, the evidence is not a list
  of strings, or the revised answer is blank;
- no evidence (`drop_no_evidence`): nothing quoted, or only the "Empty"/"none" marker, as GenGround reads it;
- unrevised (`drop_unrevised`): the revised answer equals the candidate answer after SQuAD normalisation
  (a blank revised answer counts as the candidate, as GenGround keeps it);
- revised wrongly (`drop_revised_wrongly`): a call of the question's last grounded hop whose revised answer
  is the run's final answer (equal after normalisation) while that final answer is wrong by `metric`. The
  sub-questions have no gold answers, so calls of other hops are not judged; `only_correct` drops every
  call of a question answered wrongly.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import dspy
import ujson

from arag.adapters import default_adapter
from arag.data._io import atomic_writer, check_apart
from arag.data.metrics import normalize_answer
from arag.errors import DataError
from arag.programs.genground.genground import cited_evidence
from arag.programs.genground.steps import Ground
from arag.runs import Row, last_rows, predictions_path, read_record
from arag.signatures.grounding import GroundAnswer
from arag.trace import UnreadStep, steps_of

MALFORMED, NO_EVIDENCE, UNREVISED, REVISED_WRONGLY = "malformed", "no evidence", "unrevised", "revised wrongly"
FLAWS = (MALFORMED, NO_EVIDENCE, UNREVISED, REVISED_WRONGLY)
PAPER_FILTERS = {MALFORMED, NO_EVIDENCE, REVISED_WRONGLY}  # the paper keeps groundings that confirm the candidate


def export_grounding(
    run_dir_or_predictions_path: str | Path,
    out_path: str | Path,
    only_correct: bool = False,
    *,
    metric: str | None = None,
    with_metadata: bool = True,
    drop_malformed: bool = False,
    drop_no_evidence: bool = False,
    drop_unrevised: bool = False,
    drop_revised_wrongly: bool = False,
    paper_filters: bool = False,
) -> int:
    """Write the grounding calls of a `genground` evaluation run to `out_path` as chat fine-tuning JSONL;
    returns the number of examples written.

    `run_dir_or_predictions_path` is an `arag eval --out` folder or its predictions.jsonl. A question's final
    answer counts as right when `metric` (default: any of the row's metrics) scores 1.0 on it; `only_correct`
    keeps only the calls of questions answered right. Failed examples are skipped, and an example run twice
    (a resumed run) counts once, as its last row. The `drop_*` options leave out calls with that flaw (see the
    module docstring); `paper_filters` turns on the paper's three (all but unrevised). `with_metadata=False`
    writes bare `{"messages": ...}` lines for services that refuse other keys.
    """
    check_apart(out_path, {"RUN": run_dir_or_predictions_path})
    chosen = (drop_malformed, drop_no_evidence, drop_unrevised, drop_revised_wrongly)
    dropped = {flaw for flaw, drop in zip(FLAWS, chosen) if drop} | (PAPER_FILTERS if paper_filters else set())
    predictions = predictions_path(run_dir_or_predictions_path)
    rows = [row for row in last_rows(predictions) if not row.failed]
    adapter = run_adapter(predictions.parent)
    examples, calls_seen = [], 0
    for row in rows:
        calls = grounding_calls(row, f"{predictions}, example {row.id!r}")
        calls_seen += len(calls)
        correct = answer_correct(row, metric, predictions)
        if only_correct and not correct:
            continue
        for call in calls:
            flaws = call_flaws(call, row, correct)
            if dropped.intersection(flaws):
                continue
            example = grounding_messages(call, adapter)
            if with_metadata:
                example["metadata"] = {
                    "id": row.id,
                    "hop": call.hop,
                    "batch": call.batch,
                    "passage_ids": call.passage_ids,
                    "evidence_found": call.evidence_found,
                    "final_answer_correct": correct,
                    "metrics": row.metrics,
                    "flaws": flaws,
                }
            examples.append(example)
    if not calls_seen:
        raise DataError(f"{predictions} holds no grounding calls: export_grounding reads runs of the genground program")
    _write_jsonl(Path(out_path), examples)
    return len(examples)


def grounding_calls(row: Row, where: str) -> list[Ground]:
    """The grounding calls of a row's trace; a DataError naming `where` for a grounding step that does not fit
    its declaration (without its inputs or outputs, say)."""
    for step in row.trace:
        if isinstance(step, UnreadStep) and step.kind == Ground.kind:
            raise DataError(f"{where}: {step.problem}")
    return steps_of(row, Ground)


def call_flaws(call: Ground, row: Row, final_answer_correct: bool) -> list[str]:
    """The flaws of one traced grounding call of a predictions.jsonl row (see the module docstring), in the
    order of FLAWS."""
    evidence, revised = call.outputs.get("evidence"), call.outputs.get("revised_answer")
    evidence_listed = isinstance(evidence, list) and all(isinstance(item, str) for item in evidence)
    revised_given = isinstance(revised, str) and bool(revised.strip())
    candidate = str(call.inputs.get("candidate_answer", ""))
    answer = normalize_answer(revised if revised_given else candidate)
    flaws = []
    if not (evidence_listed and revised_given):
        flaws.append(MALFORMED)
    if not (evidence_listed and cited_evidence(evidence)):
        flaws.append(NO_EVIDENCE)
    if answer == normalize_answer(candidate):
        flaws.append(UNREVISED)
    final_answer = row.prediction
    if (not final_answer_correct and isinstance(final_answer, str) and answer
            and answer == normalize_answer(final_answer) and call.hop == _last_grounded_hop(row)):
        flaws.append(REVISED_WRONGLY)
    return flaws


def _last_grounded_hop(row: Row) -> int | None:
    hops = [step.hop for step in steps_of(row, Ground)]
    return hops[-1] if hops else None


def run_adapter(run_dir: Path) -> dspy.Adapter:
    """The adapter a run's calls went through, as its run.json records it (arag's schema adapter by default)."""
    record = read_record(run_dir)
    return default_adapter(structured=record is None or record.schema is not False)


def grounding_messages(call: Ground, adapter: dspy.Adapter | None = None) -> dict[str, list[dict[str, str]]]:
    """One traced grounding call (its `inputs` and `outputs`) as `{"messages": [system, user, assistant]}`."""
    signature = _grounding_signature(with_reasoning="reasoning" in call.outputs)
    adapter = adapter or default_adapter()
    return adapter.format_finetune_data(signature, demos=[], inputs=call.inputs, outputs=call.outputs)


def answer_correct(row: Row, metric: str | None = None, where: str | Path = "row") -> bool:
    """Whether a predictions.jsonl row's answer scored 1.0 on `metric`, or on any of its metrics when None."""
    if metric is None:
        return any(score >= 1.0 for score in row.metrics.values())
    if metric not in row.metrics:
        known = ", ".join(sorted(row.metrics)) or "none"
        raise DataError(f"{where}, example {row.id!r}: no {metric!r} score; the run has {known}")
    return row.metrics[metric] >= 1.0


@functools.cache
def _grounding_signature(with_reasoning: bool) -> type[dspy.Signature]:
    """The grounding signature as the program calls it: with ChainOfThought's reasoning field, or without."""
    return dspy.ChainOfThought(GroundAnswer).predict.signature if with_reasoning else GroundAnswer


def _write_jsonl(path: Path, examples: list[dict[str, Any]]) -> None:
    with atomic_writer(path) as out:
        for example in examples:
            out.write(ujson.dumps(example, ensure_ascii=False) + "\n")
