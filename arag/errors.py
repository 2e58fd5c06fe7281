"""Errors a user can act on: the CLI prints their message and exits non-zero, without a traceback."""


class AragError(Exception):
    """Base class for every error caused by input or configuration rather than a bug."""


class ConfigError(AragError):
    """A bad program name, parameter, option or missing configuration (no LM, no retriever)."""


class FolderInUse(ConfigError):
    """A run folder that another arag process holds (its run.lock) while it writes there."""


class DataError(AragError):
    """A missing, empty or malformed dataset or corpus file; the message names file and line."""


class RetrieverError(AragError):
    """A retriever that cannot be opened or answered badly."""


class LMError(AragError):
    """An LM that cannot be reached, or whose answer lacks what a program needs (e.g. log-probabilities)."""


class QuestionFailed(Exception):
    """One question could not be answered: the LM's output was unreadable, a call failed or timed out, ...

    Not an AragError: the harness records it against that question and goes on. Carries the cause, the
    step that was running (`step`: the predictor's name and signature), and what the question did and spent
    before it failed (`trace`: its steps; `counts`: LM calls, tokens, retrievals).
    """

    def __init__(self, cause: BaseException, *, step: str | None, trace: list, counts: dict[str, int]) -> None:
        self.cause = cause
        self.kind = type(cause).__name__
        self.step = step
        self.trace = trace
        self.counts = counts
        where = f" in {step}" if step else ""
        super().__init__(f"{self.kind}{where}: {cause}")


class LMCallBudgetSpent(Exception):
    """A question reached its cap on LM calls (`max_lm_calls`): it stops there, as a failure of that question."""
