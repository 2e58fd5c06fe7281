"""Compiling a program's prompts with a DSPy teleprompter against a dataset's metric.

Every teleprompter scores with the metrics of `arag.data.metrics` through one of two adapters:

- `dspy_metric(name)`: `metric(example, pred, trace=None)`. Without a trace (Evaluate, MIPROv2's
  and COPRO's scoring, SIMBA) it returns the score; with one (bootstrapping a demo) it returns
  whether the score reaches `success_threshold`, the bool DSPy expects there.
- `feedback_metric(name)`: GEPA's five-argument form, returning the score with a textual feedback
  (what was answered, what was expected, whether a wrong answer was too long, which supporting passages were or
  were not retrieved, and whether the gold answer was in what was retrieved).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Mapping, Sequence

import dspy
import ujson

from arag.data.metrics import default_metrics, get_metric, normalize_answer, prediction_text
from arag.errors import ConfigError, DataError
from arag.lm import require_lm
from arag.programs.frame.base import RAGProgram
from arag.trace import Retrieve, steps_of

logger = logging.getLogger(__name__)

TELEPROMPTERS: dict[str, type] = {
    "bootstrap": dspy.BootstrapFewShot,
    "bootstrap-rs": dspy.BootstrapFewShotWithRandomSearch,
    "mipro": dspy.MIPROv2,
    "gepa": dspy.GEPA,
    "copro": dspy.COPRO,
    "simba": dspy.SIMBA,
}
PROPOSING = ("mipro", "gepa", "copro", "simba")
"""The teleprompters whose prompt LM writes instructions (GEPA's reflects)."""
PROPOSAL_MAX_TOKENS = 1024
"""The task LM's token cap when it also proposes instructions or reflects (no `prompt_lm` given): a small local
model that does not stop would otherwise write to the LM's whole budget (4,096 tokens) on every proposal, minutes
each, and a long proposal prompt plus that budget can pass the model's context."""
LONG_ANSWER_WORDS = 8
"""A wrong answer longer than this many words, and thrice the gold answer's, is called too long in the feedback."""
_BUDGET_OPTIONS = {"mipro": ("num_candidates", "num_trials"), "gepa": ("max_full_evals", "max_metric_calls")}
_SET_BY_ARAG = {"metric": "metric", "trainset": "trainset", "valset": "devset", "prompt_model": "prompt_lm",
                "reflection_lm": "prompt_lm", "task_model": "the configured LM", "teacher": "the program",
                "student": "the program"}


def compile(
    program: RAGProgram,
    trainset: Sequence[dspy.Example],
    devset: Sequence[dspy.Example] | None = None,
    *,
    teleprompter: str = "bootstrap",
    metric: str | None = None,
    prompt_lm: dspy.BaseLM | None = None,
    success_threshold: float = 1.0,
    threads: int = 1,
    seed: int = 0,
    keep_written_demos: bool = False,
    **options: Any,
) -> RAGProgram:
    """A compiled copy of `program`, its prompts optimised on `trainset` by `teleprompter`.

    `metric` is a metric name (default: the first metric that suits the trainset's dataset).
    `devset` is the validation set of the teleprompters that take one (bootstrap-rs, mipro, gepa).
    `prompt_lm` proposes instructions (mipro, copro, simba) or reflects (gepa); default: the task LM, capped at
    PROPOSAL_MAX_TOKENS a call.
    `options` go to the teleprompter's constructor or its `compile`, whichever takes them, e.g.
    `max_bootstrapped_demos=2`, `auto="medium"`, `num_candidate_programs=8`, `breadth=4`.
    The program's parameters (thresholds) are kept; the LM is the configured `dspy.settings.lm`.
    A program's written demos (Self-Ask's worked chains) are replaced by the teleprompter's, as DSPy does;
    `keep_written_demos` puts them back, first, before the compiled ones.
    """
    if teleprompter not in TELEPROMPTERS:
        raise ConfigError(f"unknown teleprompter {teleprompter!r}; known: {', '.join(TELEPROMPTERS)}")
    if not isinstance(program, RAGProgram):
        raise ConfigError(f"compile needs an arag program (a RAGProgram), got {type(program).__name__}")
    if not trainset:
        raise DataError("the trainset is empty")
    if threads < 1:
        raise ConfigError(f"threads must be at least 1, got {threads}")
    if not 0.0 <= success_threshold <= 1.0:
        raise ConfigError(f"success_threshold must be in [0, 1], got {success_threshold}")
    task_lm = require_lm()
    if prompt_lm is None and teleprompter in PROPOSING:
        logger.info("%s writes new instructions with the task LM itself: a small model may answer the examples "
                    "instead of rewriting the instruction (docs/tuning.md); give a stronger prompt_lm where one is at "
                    "hand", teleprompter)
    name = metric or default_metrics(trainset[0])[0]
    get_metric(name)
    if teleprompter == "copro" and devset:
        logger.info("copro scores its candidate instructions on the trainset; the devset is not used")
    init, run = _arguments(teleprompter, name, success_threshold, prompt_lm or proposing(task_lm), threads, seed,
                           _labelled(trainset), _labelled(devset) if devset else None, program.retriever)
    init, run = _place_options(teleprompter, init, run, options)
    _check_budget(teleprompter, init, run)
    try:
        optimizer = TELEPROMPTERS[teleprompter](**init)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"{teleprompter}: {exc}") from exc
    logger.info("compiling %s with %s on %d examples (metric %s)", program.name, teleprompter, len(trainset), name)
    written = {path: list(predictor.demos) for path, predictor in program.named_predictors()}
    compiled = optimizer.compile(program, **run)
    if keep_written_demos:
        for path, predictor in compiled.named_predictors():
            predictor.demos = written[path] + [demo for demo in predictor.demos if demo not in written[path]]
    return compiled


def proposing(task_lm: dspy.BaseLM) -> dspy.BaseLM:
    """The task LM as it proposes instructions or reflects: the same model, at most PROPOSAL_MAX_TOKENS a call."""
    cap = (getattr(task_lm, "kwargs", None) or {}).get("max_tokens")
    return task_lm.copy(max_tokens=min(cap, PROPOSAL_MAX_TOKENS) if cap else PROPOSAL_MAX_TOKENS)


def changes(program: RAGProgram, compiled: RAGProgram) -> dict[str, dict[str, Any]]:
    """What compiling changed in each predictor: its instructions where they differ from the program's (the new
    text), and how many demos it now holds."""
    before = {path: predictor.signature.instructions for path, predictor in program.named_predictors()}
    return {path: {"instructions": (predictor.signature.instructions
                                    if predictor.signature.instructions != before.get(path) else None),
                   "demos": len(predictor.demos)}
            for path, predictor in compiled.named_predictors()}


def tried(program: RAGProgram, compiled: RAGProgram) -> list[dict[str, Any]]:
    """What the teleprompter scored on its validation set before it chose, best first: each evaluation's score (the
    metric's mean, 0 to 1) and what the candidate changed (`changes`). GEPA's candidates, and the full evaluations
    of MIPROv2 and COPRO (a candidate evaluated twice is listed twice); the others keep no such record (empty)."""
    if (results := getattr(compiled, "detailed_results", None)) is not None:  # GEPA with track_stats
        scored = list(zip(results.candidates, results.val_aggregate_scores))
    else:  # dspy.Evaluate's percentages
        scored = [(c["program"], c["score"] / 100) for c in getattr(compiled, "candidate_programs", None) or []]
    return [{"score": round(float(score), 4), "changed": changes(program, candidate)}
            for candidate, score in sorted(scored, key=lambda pair: -pair[1])]


def dspy_metric(name: str, success_threshold: float = 1.0) -> Callable[..., float | bool]:
    """The metric `name` as DSPy calls it: a score without a trace, a success (score >= threshold) with one."""
    score = get_metric(name)

    def metric(example: dspy.Example, pred: Any, trace: Any = None) -> float | bool:
        value = score(example, pred)
        return value if trace is None else value >= success_threshold

    metric.__name__ = name
    return metric


def feedback_metric(name: str, retriever: Any = None) -> Callable[..., dspy.Prediction]:
    """The metric `name` in GEPA's form `(gold, pred, trace, pred_name, pred_trace)`: score and feedback. With the
    program's `retriever`, the feedback also says whether the gold answer was in what the program retrieved (a
    trace keeps passage ids, so the recorded queries are searched again)."""
    score = get_metric(name)

    def metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
               pred_trace: Any = None) -> dspy.Prediction:
        value = score(gold, pred)
        return dspy.Prediction(score=value, feedback=feedback_text(name, value, gold, pred, pred_name, retriever))

    metric.__name__ = name
    return metric


def feedback_text(name: str, value: float, gold: dspy.Example, pred: Any, pred_name: str | None = None,
                  retriever: Any = None) -> str:
    """What a reflecting LM needs to improve a prompt: the score, the answer against the gold answers,
    and, when the example names its supporting passages, which of them the program retrieved."""
    answers = list(gold.get("answers") or [])
    expected = repr(answers[0]) if answers else "not given"
    others = f" (also accepted: {', '.join(map(repr, answers[1:4]))})" if len(answers) > 1 else ""
    lines = [f"{name} = {value:.2f}. The program answered {prediction_text(pred)!r}; "
             + f"the gold answer is {expected}{others}."]
    if value >= 1.0:
        lines.append("The answer is right; keep what made it so.")
    words, gold_words = len(prediction_text(pred).split()), min((len(a.split()) for a in answers), default=0)
    if value < 1.0 and gold_words and words > max(LONG_ANSWER_WORDS, 3 * gold_words):
        lines.append(f"The answer is {words} words long where the gold answer has {gold_words}: "
                     "answer with the short phrase alone.")
    supporting = list(gold.get("supporting_titles") or [])
    steps = pred.get("trace") if isinstance(pred, dspy.Prediction) else None
    searches = steps_of(steps, Retrieve) if steps else []
    if supporting and steps:
        retrieved = {p["title"] for step in searches for p in step.get("passages", [])}
        found = [t for t in supporting if t in retrieved]
        missing = [t for t in supporting if t not in retrieved]
        lines.append(f"Supporting passages retrieved: {', '.join(found) or 'none'}; "
                     f"never retrieved: {', '.join(missing) or 'none'}.")
    if value < 1.0 and answers and steps is not None and retriever is not None:
        texts = [p.long_text for step in searches for p in retriever.retrieve(step["query"], step["k"])]
        read = f" {normalize_answer(' '.join(texts))} "
        held = any(normalize_answer(a) and f" {normalize_answer(a)} " in read for a in answers)
        lines.append("The gold answer is in the retrieved passages: read them for it." if held else
                     "The gold answer is in none of the retrieved passages"
                     + (": retrieve differently or answer from what is known." if texts else
                        " (nothing was retrieved)."))
    if pred_name:
        lines.append(f"This feedback is for the step {pred_name!r} of the program.")
    return " ".join(lines)


def parse_option_value(text: str) -> Any:
    """A `--option key=value` value: JSON when it parses (numbers, true/false, null, lists), else the string."""
    try:
        return ujson.loads(text)
    except ValueError:
        return text


def _arguments(teleprompter: str, metric: str, success_threshold: float, prompt_lm: dspy.BaseLM, threads: int,
               seed: int, trainset: list, devset: list | None,
               retriever: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Constructor and `compile` arguments of each teleprompter before user options (`retriever`: the program's,
    which GEPA's feedback searches again)."""
    scored = dspy_metric(metric, success_threshold)
    if teleprompter == "bootstrap":
        return {"metric": scored}, {"trainset": trainset}
    if teleprompter == "bootstrap-rs":
        return {"metric": scored, "num_threads": threads}, {"trainset": trainset, "valset": devset}
    if teleprompter == "mipro":
        return ({"metric": scored, "prompt_model": prompt_lm, "num_threads": threads, "seed": seed, "auto": "light"},
                {"trainset": trainset, "valset": devset})
    if teleprompter == "gepa":
        return ({"metric": feedback_metric(metric, retriever), "reflection_lm": prompt_lm, "num_threads": threads,
                 "seed": seed, "auto": "light", "track_stats": True}, {"trainset": trainset, "valset": devset})
    if teleprompter == "copro":
        return ({"metric": scored, "prompt_model": prompt_lm},
                {"trainset": trainset, "eval_kwargs": {"num_threads": threads, "display_progress": False}})
    return ({"metric": scored, "prompt_model": prompt_lm, "num_threads": threads, "bsize": min(32, len(trainset))},
            {"trainset": trainset, "seed": seed})


def _place_options(teleprompter: str, init: dict[str, Any], run: dict[str, Any],
                   options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """User options into the constructor or `compile` arguments, by the teleprompter's own signatures.

    Setting an explicit budget (MIPROv2's num_candidates/num_trials, GEPA's max_full_evals or
    max_metric_calls) turns the default `auto="light"` off, as those teleprompters require.
    """
    reserved = sorted(set(options) & set(_SET_BY_ARAG))
    if reserved:
        raise ConfigError(f"{teleprompter}: option(s) {', '.join(reserved)} are set from "
                          f"{', '.join(_SET_BY_ARAG[name] for name in reserved)}")
    cls = TELEPROMPTERS[teleprompter]
    init_names = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs", "_kwargs"}
    run_names = set(inspect.signature(cls.compile).parameters) - {"self", "student", "kwargs"}
    unknown = sorted(set(options) - init_names - run_names)
    if unknown:
        raise ConfigError(f"{teleprompter}: unknown option(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(init_names | run_names))}")
    if "auto" not in options and any(key in options for key in _BUDGET_OPTIONS.get(teleprompter, ())):
        init["auto"] = None
    for key, value in options.items():
        (init if key in init_names else run)[key] = value
    return init, run


def _check_budget(teleprompter: str, init: Mapping[str, Any], run: Mapping[str, Any]) -> None:
    """The budget combinations DSPy would refuse only after compiling began."""
    if teleprompter == "mipro" and init.get("auto") is None and (init.get("num_candidates") is None
                                                                  or run.get("num_trials") is None):
        raise ConfigError("mipro: without auto, give both num_candidates and num_trials")
    if teleprompter == "gepa" and init.get("auto") is None and not (init.get("max_full_evals")
                                                                    or init.get("max_metric_calls")):
        raise ConfigError("gepa: without auto, give max_full_evals or max_metric_calls")
    if teleprompter == "simba" and init["bsize"] > len(run["trainset"]):
        raise ConfigError(f"simba: bsize {init['bsize']} is larger than the trainset ({len(run['trainset'])} examples)")


def _labelled(examples: Sequence[dspy.Example]) -> list[dspy.Example]:
    """Examples with an `answer` (the first gold answer) beside `answers`: DSPy shows a labelled demo
    only when it holds the predictor's output field, and every program's output is `answer`."""
    return [e if "answer" in e or not e.get("answers") else e.copy(answer=e.answers[0]) for e in examples]
