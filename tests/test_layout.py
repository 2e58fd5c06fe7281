"""The layout docs/layout.md states: which layer of the package may import which, no import cycles, and no source
file over 450 lines."""

import ast
import fnmatch
import graphlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = (
    # From the top. A module may import from its own group and from the layers below its own, never from a layer
    # above it nor from another group of its own layer (groups in one layer are independent of each other).
    # Every import counts, those inside functions too. docs/layout.md states the same order.
    (("arag", "arag.cli", "arag.cli_logging", "arag.cli_optimize", "arag.cli_options", "arag.report", "arag.setup"),
     ("arag.testing", "arag.programs.*.stand_in")),  # a method's stand-in answers stand with the fakes that read them
    (("arag.optimizers",),),
    (("arag.evaluate",),),
    (("arag.runs",),),
    (("arag.programs",),),
    (("arag.trust",),),
    (("arag.lm",), ("arag.retrievers",), ("arag.signatures",)),
    (("arag.adapters", "arag.concurrency"),),
    (("arag.data",), ("arag.trace",)),
    (("arag.errors", "arag.passages", "arag.scratch"),),
)

MAX_LINES = 450
SOURCE_FOLDERS = ("arag", "benchmarks", "data", "docs", "optimizers", "programs", "retrievers", "scripts",
                  "signatures", "tests")
SOURCE_SUFFIXES = (".py", ".js", ".css", ".j2", ".sh")


def package_folders() -> dict[str, Path]:
    """`arag` and each top-level folder the install maps to `arag.NAME`, by package name."""
    folders = {"arag": ROOT / "arag"}
    for folder in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "arag"):
        spec = importlib.util.find_spec(f"arag.{folder.name}")
        if spec is not None and Path(spec.origin).parent == folder:
            folders[f"arag.{folder.name}"] = folder
    return folders


def package_modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name), with its file."""
    modules = {}
    for package, folder in package_folders().items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def imports(modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(importer, imported module, line) for every import of one package module by another, wherever it stands."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for module, path in modules.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
                source = ".".join(filter(None, (base, node.module)))
                names = [source] + [f"{source}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in {known(name) for name in names} - {None, module}:
                found.append((module, name, node.lineno))
    return found


def group_of(module: str) -> tuple[int, int] | None:
    """(layer, group) of a module: the first group, from the top, naming it (a name or a pattern) or the package
    holding it (`arag` names its __init__.py alone); None when no group does."""
    for layer_index, layer in enumerate(LAYERS):
        for group_index, group in enumerate(layer):
            if any(fnmatch.fnmatchcase(module, name) or name != "arag" and fnmatch.fnmatchcase(module, f"{name}.*")
                   for name in group):
                return layer_index, group_index
    return None


def layering_violations(edges: list[tuple[str, str, int]]) -> list[str]:
    """One line for each import of a module above the importer's layer, or of another group of its layer."""
    violations = []
    for importer, imported, line in edges:
        (importer_layer, importer_group), (imported_layer, imported_group) = group_of(importer), group_of(imported)
        if imported_layer < importer_layer:
            violations.append(f"{importer} (line {line}) imports {imported}, a layer above it")
        elif imported_layer == importer_layer and imported_group != importer_group:
            violations.append(f"{importer} (line {line}) imports {imported}, of its own layer but another group")
    return violations


def test_every_module_has_a_layer():
    unplaced = sorted(module for module in package_modules() if group_of(module) is None)
    assert not unplaced, f"modules in no layer (add them to LAYERS here and to docs/layout.md): {unplaced}"


def test_no_module_imports_from_a_layer_above_its_own():
    violations = layering_violations(imports(package_modules()))
    assert not violations, "imports against docs/layout.md's order:\n" + "\n".join(violations)


def test_the_check_catches_an_import_upwards_and_across():
    assert layering_violations([("arag.data.metrics", "arag.programs.frame.base", 3),
                                ("arag.lm.build", "arag.retrievers.index", 9),
                                ("arag.programs.flare", "arag.lm", 4),
                                ("arag.programs.genground.genground", "arag.programs.genground.stand_in", 5)]) == [
        "arag.data.metrics (line 3) imports arag.programs.frame.base, a layer above it",
        "arag.lm.build (line 9) imports arag.retrievers.index, of its own layer but another group",
        "arag.programs.genground.genground (line 5) imports arag.programs.genground.stand_in, a layer above it",
    ]


def test_no_import_cycles_between_modules():
    graph: dict[str, set[str]] = {}
    for importer, imported, _ in imports(package_modules()):
        graph.setdefault(importer, set()).add(imported)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"modules importing each other: {' -> '.join(error.args[1])}")


def source_files() -> list[Path]:
    return sorted(path for folder in SOURCE_FOLDERS for path in (ROOT / folder).rglob("*")
                  if path.suffix in SOURCE_SUFFIXES and path.is_file())


def test_no_source_file_over_450_lines():
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
               for path in source_files()}
    assert len(lengths) > 150  # the scope above found the project's files
    too_long = {name: lines for name, lines in lengths.items() if lines > MAX_LINES}
    assert not too_long, f"files over {MAX_LINES} lines (split them by job): {too_long}"
