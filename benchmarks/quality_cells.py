"""The rows of the quality table: a program at its defaults (or with --param), a compiled program's file, tuned
parameters (a best trial, or each member of a Pareto front), or a program answered again on another machine, and
the program each variant varies."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import dspy

import arag
from arag.optimizers.saving import read_compiled


@dataclass(frozen=True)
class Cell:
    """A row of the table: a program with its defaults (and any --param), a compiled file, tuned parameters, or a
    program answered again (--rerun)."""

    name: str  # the program's name, or it and one of VARIANTS (PROGRAM-compiled, PROGRAM-rerun), PROGRAM-tuned-N
    # or PROGRAM-rerun-MACHINE
    program: str
    params: dict = field(default_factory=dict)
    compiled: Path | None = None

    def spec(self, lm: dspy.BaseLM | None = None, corpus: Path | None = None) -> arag.RunSpec:
        """The cell's run specification (validated when made), with the model and the dataset's corpus."""
        return arag.RunSpec(program=self.program, params=self.params, compiled=self.compiled, lm=lm, corpus=corpus)


def compiled_cell(path: Path) -> Cell:
    """The cell of a compiled program's file (`arag compile --out`): PROGRAM-compiled for BootstrapFewShot
    (PROGRAM-compiled-kept when it kept the program's written demos, `--keep-written-demos`), PROGRAM-TELEPROMPTER
    for the others (single-rag-gepa, flare-mipro)."""
    compiled = read_compiled(path)
    teleprompter = compiled.meta.get("teleprompter", "bootstrap")
    variant = "compiled" if teleprompter == "bootstrap" else teleprompter
    if compiled.meta.get("keep_written_demos"):
        variant += "-kept"
    if variant not in VARIANTS:
        raise SystemExit(f"--compiled {path}: compiled by {teleprompter!r}, which the table has no row for")
    return Cell(f"{compiled.program}-{variant}", compiled.program, compiled=path)


def tuned_cell(path: Path) -> Cell:
    """The cell of a tuning run's parameter file (best_params.json, which names its program): PROGRAM-tuned, or
    PROGRAM-tuned-N for trial N of a Pareto front (pareto/trial-N.json); refused when the tuned parameters are the
    program's defaults, whose row the table has."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--tuned {path}: cannot read it ({exc})") from None
    if not (isinstance(data, dict) and isinstance(data.get("program"), str) and isinstance(data.get("params"), dict)):
        raise SystemExit(f"--tuned {path}: not a tuning run's parameter file (no 'program' and 'params')")
    program = data["program"]
    if arag.RunSpec(program=program, params=data["params"]).config == arag.RunSpec(program=program).config:
        raise SystemExit(f"--tuned {path}: the tuned parameters are {program}'s defaults, so its row would repeat "
                         f"{program}'s: not run")
    front_member = len(data.get("values") or {}) > 1 and isinstance(data.get("trial"), int)
    return Cell(f"{program}-tuned-{data['trial']}" if front_member else f"{program}-tuned", program, data["params"])


RERUN = "rerun"  # PROGRAM-rerun: the program at its defaults answered again, on another machine (--rerun)
MACHINE = re.compile(r"[a-z0-9]+")  # a further machine's rerun: PROGRAM-rerun-MACHINE (--rerun MACHINE)

# The rows beside a program's defaults, shown in this order: compiled by a teleprompter (`compiled`:
# BootstrapFewShot), with its written demos kept (`-kept`), with tuned parameters, or answered again.
VARIANTS = tuple(f"{name}{kept}" for name in ("compiled", "bootstrap-rs", "mipro", "gepa", "copro", "simba")
                 for kept in ("", "-kept")) + ("tuned", RERUN)


def held_variants(results: Path, programs: list[str], datasets: list[str], given: set[str]) -> list[Cell]:
    """The compiled and tuned rows of `programs` that the results hold and `given` lacks, for the table and the
    report to show after the others (a compiled program's file stays on the machine that compiled it; its results
    are in the repository)."""
    held = {path.stem for dataset in datasets for path in (results / dataset).glob("*.jsonl")} - given
    members = sorted((name for name in held if own_program(name) in programs and name not in
                      {f"{own_program(name)}-{variant}" for variant in VARIANTS}),
                     key=lambda name: (name.rsplit("-", 1)[0], len(name.rsplit("-", 1)[1]), name))
    return [Cell(f"{program}-{variant}", program) for variant in VARIANTS for program in programs
            if f"{program}-{variant}" in held] + [Cell(name, own_program(name)) for name in members]


def own_program(cell: str) -> str | None:
    """The program a compiled, tuned or rerun row varies (flare for flare-compiled), None for a program's own row."""
    for variant in VARIANTS:
        if cell.endswith(f"-{variant}"):
            return cell[: -len(variant) - 1]
    member = re.fullmatch(rf"(.+)-(?:tuned-\d+|{RERUN}-{MACHINE.pattern})", cell)
    return member.group(1) if member else None


def is_rerun(cell: str) -> bool:
    """Whether the row is a program's answers again on another machine (PROGRAM-rerun or PROGRAM-rerun-MACHINE)."""
    return re.fullmatch(rf".+-{RERUN}(?:-{MACHINE.pattern})?", cell) is not None


def rerun_cell(program: str, params: dict, machine: str) -> Cell:
    """The row of `program` answered again: PROGRAM-rerun, or PROGRAM-rerun-MACHINE for a further machine."""
    if machine and not MACHINE.fullmatch(machine):
        raise SystemExit(f"--rerun {machine!r}: name the machine in lower-case letters and digits, e.g. intel")
    return Cell(f"{program}-{RERUN}" + (f"-{machine}" if machine else ""), program, params)
