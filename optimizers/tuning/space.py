"""The parameters a study varies: a program's declared parameters as a `SearchSpace` selects and narrows them."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from arag.errors import ConfigError
from arag.optimizers.tuning.config import SearchSpace
from arag.programs.frame.params import Param
from arag.programs.frame.registry import get_program


def search_space(program_name: str, space: SearchSpace | None = None) -> list[Param]:
    """The parameters Optuna varies for `program_name` (see `SearchSpace`), each with a range; a ConfigError
    naming what is wrong otherwise."""
    space = space or SearchSpace()
    cls = get_program(program_name)
    declared = {p.name: p for p in cls.params}
    fixed, ranges = space.fixed, space.ranges
    for name in [*space.names, *ranges]:
        if name not in declared:
            raise ConfigError(f"{program_name} has no parameter {name!r}; known: {', '.join(declared)}")
    if space.names:
        chosen = [declared[name] for name in dict.fromkeys(space.names)]
        both = [p.name for p in chosen if p.name in fixed]
        if both:
            raise ConfigError(f"parameter(s) {', '.join(both)} are both searched and fixed")
    elif space.every_tunable:
        chosen = [p for p in cls.params if p.tunable and p.name not in fixed]
    else:
        chosen = [p for p in cls.params if p.searched and p.name not in fixed]
        chosen = [dataclasses.replace(p, low=p.search_range[0], high=p.search_range[1]) if p.search_range else p
                  for p in chosen]
    params = []
    for param in chosen:
        if param.name in ranges:
            param = _narrowed(declared[param.name], ranges[param.name], program_name)
        if param.choices is None and param.kind in (int, float) and (param.low is None or param.high is None):
            raise ConfigError(f"{program_name}: parameter {param.name!r} has no declared range; "
                              f"give one (--range {param.name}=LOW:HIGH) or fix it (--param {param.name}=VALUE)")
        params.append(param)
    for name in ranges:
        if name not in {p.name for p in params}:
            raise ConfigError(f"--range {name}: the parameter is not searched (it is fixed, or not searched by "
                              f"default: --search {name} searches it)")
    if not params:
        raise ConfigError(f"{program_name} has no parameter left to tune (searched by default: "
                          f"{', '.join(p.name for p in cls.params if p.searched) or 'none'}; tunable: "
                          f"{', '.join(p.name for p in cls.params if p.tunable) or 'none'}; fixed: "
                          f"{', '.join(fixed) or 'none'}); name some with --search NAME or --search all")
    return params


def describe(param: Param) -> dict[str, Any]:
    """A searched parameter as the study records it."""
    return {"name": param.name, "low": param.low, "high": param.high,
            "choices": list(param.choices) if param.choices is not None else None, "log": param.log}


def _narrowed(param: Param, bounds: Sequence[Any], program_name: str) -> Param:
    if param.choices is not None or param.kind not in (int, float):
        raise ConfigError(f"--range {param.name}: only numeric parameters take a range")
    if len(bounds) != 2:
        raise ConfigError(f"--range {param.name}: give a low and a high bound, got {bounds!r}")
    low, high = (param.validate(bound, program_name) for bound in bounds)
    if low > high:
        raise ConfigError(f"--range {param.name}: low {low} is above high {high}")
    return dataclasses.replace(param, low=low, high=high)
