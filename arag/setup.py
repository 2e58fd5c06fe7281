"""Setting up a run, in one place: a `RunSpec` names the program (or a compiled file), its parameters, the LM and
the retriever. Made, it is validated, once: an unknown program, a bad parameter value, a compiled file that does
not fit or chooses what only the caller may, or a missing LM is refused with one line before anything is built.
It then builds the retriever, the LM and the program, and gives a run's record (run.json).

    spec = arag.RunSpec(program="flare", params={"theta": 0.6}, lm="openai/gpt-4o-mini", corpus="corpus.jsonl")
    result = spec.evaluate(arag.load_examples("dev.jsonl"), out_dir="runs/flare", dataset="dev.jsonl")

`arag eval`, `arag compile` and `arag tune` parse their options into one; the benchmarks make theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import dspy

from arag.errors import ConfigError
from arag.runs.records import RunRecord
from arag.trace import ABSENT

if TYPE_CHECKING:
    from arag.evaluate import EvalResult
    from arag.optimizers.saving import CompiledProgram
    from arag.programs import RAGProgram
    from arag.retrievers.base import Retriever


@dataclass(frozen=True)
class LMSetup:
    """An LM to build: its spec (`local`, `local:PATH.gguf`, `provider/model`), an OpenAI-compatible server's URL,
    the environment variable holding the key, log-probabilities, other settings (`temperature`, `context_length`,
    ...), whether outputs follow each signature's JSON schema, and how many calls may run at once."""

    spec: str | None
    api_base: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    logprobs: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)
    schema: bool = True
    concurrency: int | None = None

    def check(self) -> None:
        """A ConfigError when no LM is named."""
        if not self.spec:
            raise ConfigError("no LM configured: pass --lm local (a small model run on this machine), or --lm "
                              "provider/model (with --api-base URL for a local OpenAI-compatible server such as "
                              "vLLM or Ollama), or set ARAG_LM")

    def build(self) -> dspy.BaseLM:
        """The dspy.LM, with arag's text adapter configured when the schema is off. Its server is checked later,
        by `check_server`, once the local inputs have been read."""
        from arag.adapters import TextAdapter
        from arag.concurrency import set_lm_concurrency
        from arag.lm import build_lm

        self.check()
        lm = build_lm(self.spec, api_base=self.api_base, api_key_env=self.api_key_env, logprobs=self.logprobs,
                      top_logprobs=5 if self.logprobs else None, **self.settings)
        if not self.schema:
            dspy.configure(adapter=TextAdapter())
        if self.concurrency is not None:
            set_lm_concurrency(self.concurrency)
        return lm

    def check_server(self) -> None:
        """Fail fast, before any work, when nothing listens at the server's URL."""
        from arag.lm import check_server

        if self.api_base:
            check_server(self.api_base)


@dataclass(frozen=True)
class RunSpec:
    """A run's set-up: the program by name (`program`) or a compiled file (`compiled`, whose saved parameters the
    given ones override), `params` over the named `preset`'s values, the LM (an LMSetup, an LM spec such as
    "openai/gpt-4o-mini", a built LM, or None for the one configured with dspy) and the retriever (`retriever`: a
    spec or a retriever object; else the BM25 index of `corpus`). Validated when made: `program_name` and `config`
    (the parameters the program runs with) are what validation settled."""

    program: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    preset: str | None = None
    compiled: str | Path | None = None
    lm: LMSetup | str | dspy.BaseLM | None = None
    corpus: str | Path | None = None
    retriever: Any = None
    program_name: str = field(init=False)
    config: dict[str, Any] = field(init=False)
    saved: CompiledProgram | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from arag.optimizers.saving import read_compiled
        from arag.programs import get_program
        from arag.trust import check_file_settings

        saved = read_compiled(self.compiled) if self.compiled else None
        if saved and self.program and self.program != saved.program:
            raise ConfigError(f"{self.compiled} holds a compiled {saved.program!r} program, not {self.program!r}")
        name = self.program or (saved.program if saved else None)
        if not name:
            raise ConfigError("no program: give one by name (--program NAME; `arag programs` lists them) or a "
                              "compiled program's file (--compiled FILE)")
        cls = get_program(name)
        given = cls.with_preset(self.preset, self.params)
        if saved:
            check_file_settings(str(self.compiled), saved.params, caller_sets=given)
        config = cls.resolve_config({**saved.params, **given} if saved else given)
        if isinstance(self.lm, str):
            object.__setattr__(self, "lm", LMSetup(self.lm))
        if isinstance(self.lm, LMSetup):
            self.lm.check()
        object.__setattr__(self, "program_name", name)
        object.__setattr__(self, "config", config)
        object.__setattr__(self, "saved", saved)

    def build_retriever(self) -> Retriever | None:
        """The retriever (None for a program that never retrieves); a ConfigError when one is needed and none
        given."""
        from arag.programs import get_program
        from arag.retrievers import open_retriever

        if not get_program(self.program_name).needs_retriever:
            return None
        return open_retriever(self.retriever, corpus=self.corpus)

    def build_lm(self) -> dspy.BaseLM:
        """The LM: built from its setup or spec, given built, or the one configured with dspy."""
        from arag.lm import require_lm

        if isinstance(self.lm, LMSetup):
            return self.lm.build()
        return self.lm if self.lm is not None else require_lm()

    def build_program(self, retriever: Retriever | None) -> RAGProgram:
        """The program with the validated parameters (a compiled file's prompts and demos restored)."""
        from arag.optimizers.saving import restore_program
        from arag.programs import build_program

        if self.saved is not None:
            return restore_program(self.saved, self.compiled, retriever, params=self.config)
        return build_program(self.program_name, retriever, **self.config)

    def build(self) -> tuple[dspy.BaseLM, RAGProgram]:
        """The LM and the program over its retriever, the LM's server checked: ready to run."""
        retriever = self.build_retriever()
        lm = self.build_lm()
        program = self.build_program(retriever)
        self.check_server()
        return lm, program

    def check_server(self) -> None:
        if isinstance(self.lm, LMSetup):
            self.lm.check_server()

    def record(self, dataset: str | None = None) -> RunRecord:
        """The record of a run of this spec over `dataset` (as the caller names it: a path, a dataset's name)."""
        return RunRecord(
            compiled=str(Path(self.compiled).resolve()) if self.compiled else None,
            program=self.program_name,
            params=self.config,
            dataset=dataset,
            retriever=self._retriever_named(),
            lm=self._lm_named(),
            schema=self.lm.schema if isinstance(self.lm, LMSetup) else ABSENT,
        )

    def evaluate(self, examples: Sequence[dspy.Example], *, dataset: str | None = None, **options: Any) -> EvalResult:
        """Build the LM and the program, and evaluate the program on `examples` (`arag.evaluate`'s options: out_dir,
        threads, metrics, ...), the run recorded as `record(dataset)` (default: the examples' dataset names)."""
        from arag.evaluate import dataset_names, evaluate

        lm, program = self.build()
        with dspy.context(lm=lm):
            record = self.record(dataset if dataset is not None else dataset_names(examples))
            return evaluate(program, examples, run_info=record, **options)

    def _retriever_named(self) -> str | None:
        if isinstance(self.retriever, (str, Path)):
            return str(self.retriever)
        if self.retriever is not None:
            return ABSENT  # a retriever object: nothing names it
        return str(Path(self.corpus).resolve()) if self.corpus else None

    def _lm_named(self) -> str | None:
        if isinstance(self.lm, LMSetup):
            return self.lm.spec
        lm = self.lm if self.lm is not None else dspy.settings.lm
        return str(getattr(lm, "model", None) or type(lm).__name__) if lm is not None else None
