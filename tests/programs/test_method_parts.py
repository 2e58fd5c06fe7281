"""A method's parts beside it, each collected by a registry: its step kinds (`steps.py`), their views in the
report's page (`report.js`) and its stand-in answers (`stand_in.py`)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from arag.passages import Passage
from arag.programs import PROGRAMS, build_program
from arag.report import method_views
from arag.signatures.answering import AnswerFromPassages
from arag.signatures.grounding import DeduceNextHop
from arag.signatures.summaries import propose_candidates
from arag.testing import FixedRetriever, ScriptedCall, StandInModel
from arag.testing.stand_in import responder_for
from arag.trace import STEP_KINDS, PieceStep

ROOT = Path(__file__).resolve().parents[2]
SHARED_VIEWS = ROOT / "arag" / "templates" / "report_trace.js"
SHARED_FIELDS = {"reasoning", "answer"}  # what StandInModel answers for every signature
VIEW_KEY = re.compile(r"\[K\.(\w+)\]:")


def package_kinds():
    """The kinds the package declares (a test may declare its own), by class name."""
    return {kind.__name__: kind for kind in STEP_KINDS.values() if kind.__module__.startswith("arag.")}


def test_the_methods_declare_their_kinds_beside_them():
    homes = {kind.__module__ for kind in package_kinds().values()}
    assert "arag.trace.steps" in homes
    for method in ("crag", "self_rag", "adaptive_note", "genground", "sure", "uncertainty_gate", "search_o1"):
        assert f"arag.programs.{method}.steps" in homes
    assert {"Deduce", "Ground", "Hop"} <= {name for name, kind in package_kinds().items()
                                           if kind.__module__ == "arag.programs.genground.steps"}


def test_every_kind_has_a_view_in_its_own_methods_script_or_names_the_generic_one():
    page = method_views()
    fragments = dict(re.findall(r"// (\S+): report\.js\n\{\n(.*?)\n\}\n", page, re.S))
    assert {"arag.programs.crag", "arag.programs.genground", "arag.programs.self_rag"} <= set(fragments)
    shared = set(VIEW_KEY.findall(SHARED_VIEWS.read_text(encoding="utf-8")))
    missing = []
    for name, kind in package_kinds().items():
        package = kind.__module__.rpartition(".")[0]
        if kind.__module__ == "arag.trace.steps":
            drawn = name in shared or issubclass(kind, PieceStep)  # the pieces' view is given to every piece kind
        else:
            drawn = name in VIEW_KEY.findall(fragments.get(package, ""))
        if not drawn:
            missing.append(f"{name} ({kind.__module__})")
    assert not missing, f"kinds without a view (a method's report.js names genericStep for fields alone): {missing}"
    unknown = set(VIEW_KEY.findall(page)) - set(package_kinds())
    assert not unknown, f"views of kinds no one declares: {sorted(unknown)}"


def test_the_page_holds_each_methods_script_once_in_a_block_of_its_own():
    page = method_views()
    assert page.count("// arag.programs.genground: report.js\n{\n") == 1
    assert "[K.Deduce]:" in page and "[K.Evaluate]:" in page
    assert page.count("function scoreBar(") == 1  # CRAG's helper, in CRAG's block only


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_signature_a_program_uses_has_stand_in_answers(name):
    StandInModel()  # loads every method's stand_in.py
    passages = [Passage("p1", "Paris", "Paris is the capital of France."), Passage("p2", "Rome", "Rome is in Italy.")]
    unanswered = []
    for path, predictor in build_program(name, FixedRetriever(passages)).named_predictors():
        signature = predictor.signature
        outputs = set(signature.output_fields)
        if responder_for(signature.input_fields, signature.output_fields) is None and not outputs <= SHARED_FIELDS:
            unanswered.append(f"{path}: {signature.signature}")
    assert not unanswered, f"{name}: signatures no stand_in.py answers: {unanswered}"


def test_a_method_answers_its_own_signature_and_others_get_the_shared_answers():
    model = StandInModel()

    def call(signature, **inputs):
        return ScriptedCall("", inputs, ["reasoning", *signature.output_fields], "", False, "chat",
                            input_fields=tuple(signature.input_fields))

    deduced = model(call(DeduceNextHop, question="Who founded Rome?", history="[]"))
    assert deduced == {"reasoning": "Reading the material step by step.", "finished": False,
                       "sub_question": "What is Rome known for?", "answer": "Rome"}
    assert model(call(AnswerFromPassages, question="Who founded Rome?", passages="[]"))["answer"] == "Rome"
    candidates = model(call(propose_candidates(3), question="Who founded Rome?", passages="[1] Romulus | ..."))
    assert [candidates[f"candidate_{n}"] for n in (1, 2, 3)] == ["Rome", "Romulus", "Rome"]


def test_importing_arag_imports_no_test_fakes():
    code = ("import sys, arag; fakes = sorted(m for m in sys.modules if m.startswith('arag.testing') "
            "or m.endswith('.stand_in')); print(fakes); sys.exit(1 if fakes else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
