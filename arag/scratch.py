"""Scratch folders: the folders arag makes to work in (an index's staging folder, a dense build's saved chunks, a
model being assembled) and removes when done.

arag writes a marker file into each such folder as it creates it, before anything else, and it resumes, writes
into or removes a folder only when that marker is there. Anything else found at a scratch folder's path (a folder
of the user's, a file, a symbolic link to anywhere) is refused with `ForeignFolder`: never written into, never
followed, never removed. Scratch folders named `PREFIX<pid>-<random>` belong to one process; those whose process
no longer runs on this machine are removed by `remove_abandoned` (the leftovers of a killed build).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

from arag.errors import ConfigError

MARKER = ".arag-scratch"

logger = logging.getLogger("arag")


class ForeignFolder(ConfigError):
    """Something arag did not create stands where it would keep a scratch folder."""


def is_scratch(path: Path) -> bool:
    """True when `path` is a folder (not a link to one) holding arag's marker file (not a link either)."""
    marker = path / MARKER
    return not path.is_symlink() and path.is_dir() and not marker.is_symlink() and marker.is_file()


def check_scratch(path: Path) -> Path:
    """`path`, when it is a scratch folder of arag's; ForeignFolder naming it otherwise."""
    if not is_scratch(path):
        what = "a symbolic link" if path.is_symlink() else "a folder" if path.is_dir() else "a file"
        raise ForeignFolder(f"{path} is {what} that arag did not create (it lacks arag's {MARKER} marker), where arag "
                            "keeps a scratch folder of its own; arag leaves it untouched: move it away, or build "
                            "elsewhere")
    return path


def create_scratch(path: Path) -> Path:
    """Makes `path` (and its missing parents) as a new scratch folder, its marker written first; ForeignFolder
    when anything already stands there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        check_scratch(path)
        raise
    with open(path / MARKER, "x", encoding="utf-8") as marker:
        marker.write(f"made by arag (process {os.getpid()}), which may remove this folder\n")
    return path


def open_scratch(path: Path) -> Path:
    """The scratch folder at `path` to resume (one arag made earlier), else a new one."""
    if os.path.lexists(path):
        return check_scratch(path)
    return create_scratch(path)


def remove_scratch(path: Path, *, missing_ok: bool = False) -> None:
    """Removes the scratch folder at `path` with everything in it; ForeignFolder, removing nothing, when it is
    not arag's."""
    if missing_ok and not os.path.lexists(path):
        return
    shutil.rmtree(check_scratch(path))


def process_scratch(parent: Path, prefix: str) -> Path:
    """A new scratch folder in `parent` owned by this process: named `prefix`, this process's id and a random
    suffix, so that `remove_abandoned` can tell when its owner is gone."""
    return create_scratch(parent / f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def remove_abandoned(parent: Path, prefix: str) -> list[Path]:
    """Removes the scratch folders of `process_scratch(parent, prefix)` whose process no longer runs on this
    machine; those without arag's marker are left alone. Returns the removed ones."""
    removed = []
    if not parent.is_dir():
        return removed
    for path in parent.iterdir():
        pid = path.name.removeprefix(prefix).partition("-")[0] if path.name.startswith(prefix) else ""
        if not pid.isdigit() or process_exists(int(pid)):
            continue
        if is_scratch(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        else:
            logger.warning("leaving %s, named like arag's scratch but without its %s marker (not made by arag, or "
                           "by an older version): remove it yourself if it is not yours", path, MARKER)
    return removed


def process_exists(pid: int) -> bool:
    """True when a process of this id runs on this machine (whoever owns it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, and belongs to another user
    return True
