"""Declared program parameters: one declaration gives the default, validation, CLI parsing and search space."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from arag.errors import ConfigError


@dataclass(frozen=True)
class Param:
    """A program parameter: its type, default, valid range or choices, whether it may be tuned (`tunable`), and
    whether `arag tune` searches it unless told otherwise (`searched`: the method's thresholds and decision
    knobs), over `search_range` when that is narrower than the valid range. `at_most` names a parameter this one
    may not exceed (CRAG's lower and upper thresholds): the search draws it up to that parameter's value."""

    name: str
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: Sequence[Any] | None = None
    log: bool = False
    tunable: bool = True
    searched: bool = False
    search_range: tuple[float, float] | None = None
    at_most: str | None = None

    @property
    def kind(self) -> type:
        return type(self.default)

    def validate(self, value: Any, program: str = "") -> Any:
        """The value coerced to the parameter's type (strings from the CLI included), or a ConfigError."""
        where = f"{program}: " if program else ""
        try:
            value = self._coerce(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{where}parameter {self.name!r} must be {self.kind.__name__}, got {value!r}"
            ) from None
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{where}parameter {self.name!r} must be one of {list(self.choices)}, got {value!r}")
        if self.low is not None and value < self.low or self.high is not None and value > self.high:
            raise ConfigError(f"{where}parameter {self.name!r} must be in [{self.low}, {self.high}], got {value!r}")
        return value

    def admits(self, value: Any) -> bool:
        """Whether `value` is valid for this parameter, within its range."""
        try:
            self.validate(value)
        except ConfigError:
            return False
        return True

    def _coerce(self, value: Any) -> Any:
        kind = self.kind
        if kind is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in {"true", "false", "1", "0", "yes", "no"}:
                    raise ValueError(value)
                return lowered in {"true", "1", "yes"}
            if not isinstance(value, bool):
                raise TypeError(value)
            return value
        if kind is int:
            if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
                raise TypeError(value)
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise TypeError(value)
            return float(value)
        if not isinstance(value, str):
            raise TypeError(value)
        return value

    def suggest(self, trial: Any, chosen: Mapping[str, Any] | None = None) -> Any:
        """Optuna's suggestion for this parameter within its declared range, and at most the value `chosen` gives
        the parameter named by `at_most`."""
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind is int:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        if self.kind is float:
            high = self.high
            if self.at_most is not None and chosen and self.at_most in chosen:
                high = max(self.low, min(high, chosen[self.at_most]))
            return trial.suggest_float(self.name, self.low, high, log=self.log)
        if self.kind is bool:
            return trial.suggest_categorical(self.name, [False, True])
        raise ConfigError(f"parameter {self.name!r} has no search space")

    def describe(self) -> str:
        if self.choices is not None:
            space = "|".join(map(str, self.choices))
        elif self.low is not None or self.high is not None:
            space = f"[{self.low}, {self.high}]"
        else:
            space = self.kind.__name__
        if self.searched:
            low, high = self.search_range or (self.low, self.high)
            space += " (tuned by default" + (f" over [{low}, {high}])" if self.search_range else ")")
        return f"{self.name}={self.default!r} {space}  {self.help}"


def passages_per_retrieval(default: int, why: str = "", **options: Any) -> Param:
    """`k`, the passages each retrieval returns: declared here once, with each program's default (and where that
    default comes from)."""
    return Param("k", default, "passages per retrieval" + (f" ({why})" if why else ""), low=1, high=100, **options)


FLARE_SETTING_K = passages_per_retrieval(2, "FLARE's official multi-hop QA setting, shared by its baselines")


def resolve_params(declared: Sequence[Param], given: Mapping[str, Any], program: str) -> dict[str, Any]:
    """Defaults overlaid with the given values, each validated; an unknown name is a ConfigError."""
    by_name = {p.name: p for p in declared}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        known = ", ".join(by_name) or "none"
        raise ConfigError(f"{program}: unknown parameter(s) {', '.join(unknown)}; known: {known}")
    return {name: p.validate(given.get(name, p.default), program) for name, p in by_name.items()}


def parse_assignments(pairs: Sequence[str]) -> dict[str, str]:
    """`key=value` strings from the command line into a dict."""
    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param expects key=value, got {pair!r}")
        parsed[key.strip()] = value.strip()
    return parsed
