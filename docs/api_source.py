"""MkDocs hook: `arag` laid out as installed, for the API reference.

arag's subpackages are folders beside arag/ (programs/, retrievers/, ...) that the install maps into it, while
mkdocstrings reads packages as they lie on disk. Before mkdocstrings starts (its handler takes its search paths
when the configuration is read), this writes API_SOURCE/arag: links to every entry of arag/ and to each
top-level folder that the install maps to arag.NAME. mkdocs.yml names API_SOURCE in mkdocstrings' `paths`.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
API_SOURCE = ROOT / "build" / "api-source"


@event_priority(100)  # before mkdocstrings' own on_config
def on_config(config):
    shutil.rmtree(API_SOURCE, ignore_errors=True)
    package = API_SOURCE / "arag"
    package.mkdir(parents=True)
    for entry in (ROOT / "arag").iterdir():
        (package / entry.name).symlink_to(entry)
    for folder in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file()):
        if (package / folder.name).exists() or importlib.util.find_spec(f"arag.{folder.name}") is None:
            continue  # arag itself, or a folder that is not part of the package
        (package / folder.name).symlink_to(folder)
    return config
