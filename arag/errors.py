"""Errors a user can act on: the CLI prints their message and exits non-zero, without a traceback."""


class AragError(Exception):
    """Base class for every error caused by input or configuration rather than a bug."""


class ConfigError(AragError):
    """A bad program name, parameter, option or missing configuration (no LM, no retriever)."""


class DataError(AragError):
    """A missing, empty or malformed dataset or corpus file; the message names file and line."""


class RetrieverError(AragError):
    """A retriever that cannot be opened or answered badly."""


class LMError(AragError):
    """An LM that cannot be reached, or whose answer lacks what a program needs (e.g. log-probabilities)."""
