"""What a file may choose, and what only the caller may.

Parameters files (`--params-file`, `arag tune`'s best_params.json), compiled programs and router files are data
from wherever they came from: they get shared. Such a file may set thresholds, prompts and demos; it may never
choose where arag connects or which of the user's keys it spends. A value naming an endpoint (anything with
`://`, e.g. `serper:http://host` or `local:http://host/api/search`) or a key-bearing backend (a web search that
sends SERPER_API_KEY, TAVILY_API_KEY or BRAVE_API_KEY with every query, e.g. `serper`) comes only from the
command line, the caller's Python or the environment. Every loader calls `check_file_settings`, which refuses such
a value with one line naming the file and the key, unless the caller sets that same setting itself (then the
file's value is not used).
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from arag.errors import DataError
from arag.retrievers.web import PROVIDERS


def network_choice(value: Any) -> str | None:
    """What `value` chooses that only the caller may ("an address", "a key-bearing search backend (...)"), or None.
    Lists and objects are looked through."""
    if isinstance(value, Mapping):
        return next(filter(None, map(network_choice, value.values())), None)
    if isinstance(value, (list, tuple)):
        return next(filter(None, map(network_choice, value)), None)
    if not isinstance(value, str):
        return None
    if "://" in value:
        return "an address"
    name, colon, location = value.strip().partition(":")
    provider = PROVIDERS.get(name.strip().lower())
    if provider is not None and provider.key_env:
        return f"a search backend that is sent {provider.key_env}"
    if provider is not None and colon and location.strip():
        return "a search endpoint"
    return None


def check_file_settings(source: str, settings: Mapping[str, Any], *, key: str = "params",
                        caller_sets: Collection[str] = (), hint: str | None = "--param {name}=...") -> None:
    """A DataError naming `source` and `key[name]` for the first setting that chooses an endpoint or a key-bearing
    backend (see `network_choice`) and that the caller does not set itself (`caller_sets`). `hint` tells how to
    give it instead ({name} is filled in); None when there is no such way."""
    for name, value in settings.items():
        if name in caller_sets:
            continue
        what = network_choice(value)
        if what is None:
            continue
        shown = value[:200] if isinstance(value, str) else str(value)[:200]
        how = f": give it yourself ({hint.format(name=name)}) to use it" if hint else ""
        raise DataError(f"{source}: {key}[{name!r}] names {what} ({shown}); a file may not choose where arag "
                        f"connects or which key it sends{how}")
