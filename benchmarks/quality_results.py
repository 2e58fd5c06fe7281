"""The quality table's results: each cell's questions as the repository keeps them (benchmarks/results/quality/...),
compact rows of its run folder's rows, read and written only here.

A kept row is a run's row (`arag.runs.Row`) without its question, gold answers and trace text: the answer, scores,
costs, the count of each step kind, the commit that answered it and the kind of CPU it was answered on (a local
model's greedy answers can differ between CPU kinds, so a cell is also compared with the baseline answered on the
same kind). A cell's file is written whole, atomically.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import dspy
from pydantic import ConfigDict, TypeAdapter
from quality_cells import is_rerun, own_program

from arag.data._io import atomic_writer
from arag.errors import DataError
from arag.lm.local import cpu_kind
from arag.runs import PREDICTIONS, Row, Run, RunRecord, last_rows, summarize
from arag.runs.records import Counts, Number, Text, Whole, read_declared
from arag.runs.table import Difference, paired_difference


@dataclass(frozen=True, kw_only=True)
class KeptRow(Counts):
    """One question of a cell as its results keep it (a failed question: its error's kind and step, not its
    message, which stays in the run folder)."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    id: Text
    prediction: Any = None
    metrics: dict[str, Number]
    seconds: Number | None = None
    error_kind: Text | None = None
    error_step: Text | None = None
    steps: dict[str, Whole]  # how many steps of each kind the trace holds
    commit: Text
    cpu: Text | None = None  # `cpu_kind()` of the machine that answered it; None: not recorded (older rows)

    @property
    def failed(self) -> bool:
        return self.error_kind is not None

    @classmethod
    def of(cls, row: Row, commit: str) -> KeptRow:
        """What the results keep of a run folder's row, answered at `commit` on this machine."""
        return cls(id=row.id, prediction=row.prediction, metrics=row.metrics,
                   **row.counts(), seconds=row.seconds,
                   error_kind=row.error_kind if row.failed else None, error_step=row.error_step if row.failed else None,
                   steps=dict(Counter(step.kind for step in row.trace)), commit=commit, cpu=cpu_kind())

    @classmethod
    def from_json(cls, data: Any, where: str) -> KeptRow:
        if not isinstance(data, dict):
            raise DataError(f"{where}: not a kept row of the quality table (a JSON object)")
        return read_declared(_KEPT, data, where, "a kept row of the quality table")

    def to_json(self) -> dict[str, Any]:
        """The line the results hold: the row's keys in the order its run folder's row has them."""
        kept: dict[str, Any] = {"id": self.id, "prediction": self.prediction, "metrics": self.metrics}
        kept.update(self.recorded_counts())
        if self.seconds is not None:
            kept["seconds"] = self.seconds
        if self.failed:
            kept.update(error_kind=self.error_kind, error_step=self.error_step)
        return {**kept, "steps": self.steps, "commit": self.commit, **({"cpu": self.cpu} if self.cpu else {})}

    def as_row(self, example: dspy.Example) -> Row:
        """The kept row as readers of runs (`arag table`, `arag report`) take it: the question and gold answers read
        back from the dataset, no trace, and a failure's error given as its kind."""
        return Row(id=self.id, question=example.question, answers=list(example.answers), metrics=self.metrics,
                   trace=[], prediction=self.prediction, seconds=self.seconds,
                   **self.counts(), error=self.error_kind,
                   error_kind=self.error_kind, error_step=self.error_step)


_KEPT = TypeAdapter(KeptRow)


def read_results(path: Path) -> dict[str, KeptRow]:
    """A cell's kept rows by id (written whole, atomically: no half line to guard against)."""
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [KeptRow.from_json(json.loads(line), f"{path}:{lineno}") for lineno, line in enumerate(lines, 1) if line]
    return {row.id: row for row in rows}


def cell_rows(results: Path, dataset: str, cell: str, examples: list[dspy.Example]) -> list[Row]:
    """The rows of a cell's results for those of `examples` it has answered, in their order, as readers of runs
    take them."""
    return answered_rows(read_results(results / dataset / f"{cell}.jsonl"), examples)


def answered_rows(kept: dict[str, KeptRow], examples: list[dspy.Example]) -> list[Row]:
    """Those of `examples` that `kept` holds, in their order, as rows."""
    return [kept[e.id].as_row(e) for e in examples if e.id in kept]


def sync(run_dir: Path, results: Path, commit: str) -> dict[str, KeptRow]:
    """The cell's results, with every question the run folder finished since added (the run folder's newer row
    wins: a failure retried); written atomically. Run folders stay on the machine that answered their rows, so a
    kept row that one holds and that lacks its CPU kind gets this machine's."""
    kept = read_results(results)
    run_rows = last_rows(run_dir) if (run_dir / PREDICTIONS).exists() else []
    changed = False
    for row in run_rows:
        earlier = kept.get(row.id)
        if earlier is None or earlier.seconds != row.seconds:
            kept[row.id] = KeptRow.of(row, earlier.commit if earlier else commit)
            changed = True
        elif earlier.cpu is None:
            kept[row.id] = replace(earlier, cpu=cpu_kind())
            changed = True
    if changed:
        with atomic_writer(results) as handle:
            for row in kept.values():
                handle.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
    return kept


def results_run(path: Path, name: str, rows: list[Row], n_total: int, record: RunRecord) -> Run:
    """A cell's kept rows as a run for `arag report` (no trace: the traces stay in the run folders)."""
    return Run(path, name, record, rows, summarize(rows, n_total=n_total, wall_time=0.0, record=record))


def baseline_rows(folder: Path, baseline: str) -> dict[str, dict[str, KeptRow]]:
    """`baseline`'s kept rows in a dataset's results `folder`, then each of its reruns' (BASELINE-rerun,
    BASELINE-rerun-MACHINE): the rows a cell is compared with on its own kind of CPU."""
    reruns = sorted(path.stem for path in folder.glob(f"{baseline}-*.jsonl")
                    if is_rerun(path.stem) and own_program(path.stem) == baseline)
    return {name: read_results(folder / f"{name}.jsonl") for name in [baseline, *reruns]}


def same_cpu_difference(kept: dict[str, KeptRow], folder: Path, baseline: str,
                        examples: list[dspy.Example]) -> Difference | None:
    """A cell's F1 difference from `baseline`'s kept rows in the dataset's results `folder` (its own, then its
    reruns') over those of `examples` the baseline answered on the CPU kind the cell's answer came from: the
    difference without the machine's share. None where no such question is at hand (rows whose CPU is not recorded
    pair with none)."""
    baselines = baseline_rows(folder, baseline).values()
    scores, baseline_scores = {}, {}
    for example in examples:
        row = kept.get(example.id)
        same = row and row.cpu and next((b[example.id] for b in baselines
                                         if example.id in b and b[example.id].cpu == row.cpu), None)
        if same:
            scores[example.id], baseline_scores[example.id] = row.metrics.get("f1", 0.0), same.metrics.get("f1", 0.0)
    return paired_difference(scores, baseline_scores)
