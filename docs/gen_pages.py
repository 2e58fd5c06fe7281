"""The site's generated pages, written at build time by mkdocs-gen-files (mkdocs.yml names this script).

- programs/reference.md: every registered program's declared parameters, presets, `follows`, `departures`, the LM
  calls its algorithm requires and its module docstring (the algorithm box), read from the program registry.
- trace-steps.md: every trace step kind with its fields, read from docs/trace.schema.json.
- quality/table.md: the quality table, printed by `python benchmarks/quality.py --table` for each model whose
  results are under benchmarks/results/quality/, and `benchmarks/flashrag_comparison.py`'s table beside it.
- benchmarks/full.md: benchmarks/README.md as it is.
"""

from __future__ import annotations

import inspect
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("mkdocs.plugins.gen_pages")


def cell(text: Any) -> str:
    """Text that stays inside one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def param_values(param) -> str:
    if param.choices is not None:
        return " \\| ".join(f"`{choice}`" for choice in param.choices)
    if param.low is not None or param.high is not None:
        return f"{param.low} to {param.high}"
    return param.kind.__name__


def param_search(param) -> str:
    if not param.tunable:
        return "never"
    if not param.searched:
        return "when named"
    low, high = param.search_range or (param.low, param.high)
    return f"by default, over {low} to {high}" if param.search_range else "by default"


def summary_line(cls) -> str:
    doc = cls.__doc__ or sys.modules[cls.__module__].__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def program_section(name: str, cls) -> list[str]:
    module = sys.modules[cls.__module__]
    lines = [f"## `{name}`", "", summary_line(cls), ""]
    if cls.follows:
        lines += [f"**Follows** {cls.follows}.", ""]
    for departure in cls.departures:
        lines += [f"- **Departs:** {departure}"]
    if cls.departures:
        lines.append("")
    if cls.lm_calls_formula:
        lines += [f"**LM calls the algorithm requires:** {cls.lm_calls_formula}.", ""]
    if not cls.needs_retriever:
        lines += ["Takes no retriever.", ""]
    if cls.params:
        lines += ["| parameter | default | values | searched by `arag tune` | meaning |", "|---|---|---|---|---|"]
        lines += [f"| `{p.name}` | `{p.default!r}` | {param_values(p)} | {param_search(p)} | {cell(p.help)} |"
                  for p in cls.params]
        lines.append("")
    for preset, values in cls.presets.items():
        settings = ", ".join(f"`{key}={value}`" for key, value in values.items())
        lines += [f"- Preset `{preset}`: {settings}"]
    if cls.presets:
        lines.append("")
    if module.__doc__:
        lines += [f'??? note "The algorithm: `{module.__name__}`"', "", "    ```text"]
        lines += [f"    {line}".rstrip() for line in inspect.cleandoc(module.__doc__).splitlines()]
        lines += ["    ```", ""]
    return lines


def programs_page() -> str:
    from arag.programs import PROGRAMS

    lines = ["# Program reference", "",
             "Generated from the program registry when the site is built: what `arag programs` prints, for every "
             "registered program. Defaults are the papers'; `follows` and `departs` say where a program takes the "
             "paper's text, the official code's, or neither, and why. [Programs](index.md) tells how parameters, "
             "presets and the official settings are given.", "",
             "| program | what it does | parameters (defaults) | LM calls |", "|---|---|---|---|"]
    for name in sorted(PROGRAMS):
        cls = PROGRAMS[name]
        params = ", ".join(f"`{p.name}` {p.default!r}" for p in cls.params) or "—"
        lines.append(f"| [`{name}`](#{name}) | {cell(summary_line(cls))} | {cell(params)} "
                     f"| {cell(cls.lm_calls_formula or '—')} |")
    lines.append("")
    for name in sorted(PROGRAMS):
        lines += program_section(name, PROGRAMS[name])
    return "\n".join(lines) + "\n"


def schema_type(node: dict) -> str:
    """A JSON schema node in a few words: `string`, `list of integer`, `one of "a", "b"`, ..."""
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{value}`" for value in node["enum"])
    if "anyOf" in node:
        return " or ".join(schema_type(option) for option in node["anyOf"])
    kind = node.get("type")
    if kind == "array":
        if "prefixItems" in node:
            return "pair of " + ", ".join(schema_type(item) for item in node["prefixItems"])
        return "list of " + schema_type(node.get("items", {}))
    if kind == "object":
        fields = node.get("properties")
        if fields:
            return "object (" + ", ".join(f"`{name}`" for name in fields) + ")"
        return "object"
    return kind or "any value"


def trace_page() -> str:
    schema = json.loads((ROOT / "docs" / "trace.schema.json").read_text())
    lines = ["# Trace step kinds", "",
             f"Generated from [`docs/trace.schema.json`](trace.schema.json), the trace's JSON schema, when the site "
             f"is built. {schema['description']} A field not marked required may be absent from a step. "
             "[The trace](trace.md) tells how to read one.", ""]
    for kind, node in sorted(schema["$defs"].items()):
        lines += [f"## `{kind}`", "", node.get("description", ""), "",
                  "| field | type | required |", "|---|---|---|"]
        required = set(node.get("required", ()))
        notes = []
        for field, spec in node.get("properties", {}).items():
            if field == "step":
                continue
            lines.append(f"| `{field}` | {cell(schema_type(spec))} | {'yes' if field in required else ''} |")
            if "description" in spec:
                notes.append((field, spec["description"]))
        lines.append("")
        for field, text in notes:
            meanings = [part.partition(": ") for part in text.split("; ")]
            lines += [f"`{field}`:", ""] + [f"- `{value}`: {meaning}" for value, _, meaning in meanings] + [""]
    return "\n".join(lines) + "\n"


def quality_page() -> str:
    lines = ["---", "hide: [navigation, toc]", "---", "", "# The quality table", "",
             "Printed by `python benchmarks/quality.py --table` from the compact results in "
             "`benchmarks/results/quality/` when the site is built, and beside it FlashRAG's published F1 for the "
             "methods both run (`python benchmarks/flashrag_comparison.py`). [Quality](index.md) says how the matrix "
             "was run and what the rows' traces show.", ""]
    for model in sorted(p.name for p in (ROOT / "benchmarks" / "results" / "quality").iterdir() if p.is_dir()):
        lines += [f"## {model}", "", *printed(["benchmarks/quality.py", "--table", "--model", model]),
                  "### Beside FlashRAG's table", "",
                  *printed(["benchmarks/flashrag_comparison.py", "--model", model])]
    return "\n".join(lines) + "\n"


def printed(script: list[str]) -> list[str]:
    """What a benchmark script that reads the shared datasets prints, or a warning in its place."""
    done = subprocess.run([sys.executable, *script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
        return [done.stdout.strip(), ""]
    problem = (done.stderr.strip().splitlines() or ["no message"])[-1]
    shared = ROOT.parent / "shared" / "datasets"
    if shared.is_dir():  # the questions are there, so the table should have printed: a real failure
        log.warning("%s failed: %s", " ".join(script), problem)
    else:
        log.info("%s left out: no datasets at %s", " ".join(script), shared)
    return ['!!! warning "Not printed in this build"', "",
            f"    `{' '.join(script)}` reads the questions from `../shared/datasets/` and stopped with: "
            f"`{cell(problem)}`", ""]


def write(path: str, text: str) -> None:
    with mkdocs_gen_files.open(path, "w") as page:
        page.write(text)


write("programs/reference.md", programs_page())
write("trace-steps.md", trace_page())
write("quality/table.md", quality_page())
write("benchmarks/full.md", (ROOT / "benchmarks" / "README.md").read_text())
