"""The scale benchmark's table: each figure read from the results, projected to larger corpora by a growth
model through the two largest measured sizes, and printed as Markdown (benchmarks/scale.py measures and writes
the results)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

TOP_K = 10
DPR_WIKIPEDIA = 21_015_324  # passages of the 100-word DPR Wikipedia split (Pyserini's wikipedia-dpr-100w)
POWER, LINEAR = "power", "linear"


def growth(points: list[tuple[int, float]], size: int, model: str = POWER) -> tuple[float, float] | None:
    """(value at `size`, b) of a growth model through the two largest measured sizes: a power law y = a n^b
    (b the exponent) or a line y = a + b n (b per million passages; a falling line is taken as flat)."""
    points = sorted(point for point in points if point[1] and point[1] > 0)
    if len(points) < 2:
        return None
    (n1, y1), (n2, y2) = points[-2:]
    if model == POWER:
        exponent = math.log(y2 / y1) / math.log(n2 / n1)
        return y2 * (size / n2) ** exponent, exponent
    slope = max(0.0, (y2 - y1) / (n2 - n1))  # a line falling with n is noise: taken as flat
    return y2 + slope * (size - n2), slope * 1e6


@dataclass(frozen=True)
class Figure:
    """One figure of a result: how to read it, and how it is projected to larger corpora: by its own growth model,
    or in proportion (`inverse`: in inverse proportion) to the projection of the figure it `follows`."""

    read: Callable[[dict], float | None]
    model: str
    unit: str
    follows: str | None = None
    inverse: bool = False


FIGURES: dict[str, Figure] = {
    # Time, memory and disk: a power law, which the measured growth shows close to linear in the passages.
    "build_s": Figure(lambda r: r["build"]["build_s"], POWER, "s"),
    "build_cpu_s": Figure(lambda r: r["build"].get("build_cpu_s"), POWER, "s"),
    "build_peak": Figure(lambda r: max(r["build"]["build_memory"]["peak"], r["build"]["build_memory"]["children_peak"]),
                         POWER, "B"),
    "disk_bytes": Figure(lambda r: r["build"]["disk_bytes"], POWER, "B"),
    "serving_rss": Figure(lambda r: r["serve"]["serving_memory"]["rss"], POWER, "B"),
    "serving_anon": Figure(lambda r: r["serve"]["serving_memory"]["rss_anon"], POWER, "B"),
    # One client: a fixed cost per query plus work in proportion to the postings or lists scanned, which grow
    # with n; the tail keeps its ratio to the median.
    "p50_1": Figure(lambda r: r["serve"]["clients_1"]["p50_ms"], LINEAR, "ms"),
    "p99_1": Figure(lambda r: r["serve"]["clients_1"]["p99_ms"], LINEAR, "ms", follows="p50_1"),
    "cpu_1": Figure(lambda r: r["serve"]["clients_1"].get("cpu_ms_per_query"), LINEAR, "ms"),
    # 16 clients keep the cores busy: throughput falls as each query's work (the 1-client median, which is close to
    # its CPU time for every engine here) grows, and with 16 queries always in flight latency is 16 / throughput
    # (Little's law).
    "qps_16": Figure(lambda r: r["serve"]["clients_16"]["queries_per_s"], LINEAR, "queries/s", follows="p50_1",
                     inverse=True),
    "p50_16": Figure(lambda r: r["serve"]["clients_16"]["p50_ms"], LINEAR, "ms", follows="qps_16", inverse=True),
    "p99_16": Figure(lambda r: r["serve"]["clients_16"]["p99_ms"], LINEAR, "ms", follows="qps_16", inverse=True),
}


def read_results(out: Path) -> dict[str, dict[int, dict]]:
    results: dict[str, dict[int, dict]] = {}
    for path in sorted(out.glob("*.json")):
        result = json.loads(path.read_text())
        if "engine" in result:
            results.setdefault(result["engine"], {})[result["size"]] = result
    return results


def gigabytes(value: float) -> str:
    return f"{value / 2**30:.2f} GB"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def table_row(name: str, size: int, label: str, value: dict, agreement_cell: str, hit_cell: str) -> str:
    def shown(figure: str, form: Callable[[float], str]) -> str:
        return "—" if value.get(figure) is None else form(value[figure])

    return (
        f"| {name} | {size:,} | {label} | {duration(value['build_s'])} | {shown('build_cpu_s', duration)} "
        f"| {gigabytes(value['build_peak'])} | {gigabytes(value['disk_bytes'])} "
        f"| {gigabytes(value['serving_rss'])} ({gigabytes(value['serving_anon'])}) "
        f"| {value['p50_1']:.1f} / {value['p99_1']:.1f} ms | {shown('cpu_1', lambda ms: f'{ms:.1f} ms')} "
        f"| {value['p50_16']:.1f} / {value['p99_16']:.1f} ms | {value['qps_16']:,.0f} | {agreement_cell} | {hit_cell} |"
    )


def table(results: dict[str, dict[int, dict]], projected_sizes: list[int]) -> str:
    """Measured rows, then each engine projected to the sizes it was not measured at."""
    lines = [
        "| engine | passages | figures | build | build CPU | build peak RAM | on disk | serving RSS (anon) | "
        "p50 / p99, 1 client | CPU per query, 1 client | p50 / p99, 16 clients | queries/s, 16 clients "
        "| top-10 agreement (with) | source hit@10 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_size in results.items():
        for size, result in sorted(by_size.items()):
            quiet = all(phase["paused_s"] >= 0.99 * phase["seconds"] for phase in result["phases"].values())
            agree = result.get("agreement")
            lines.append(table_row(
                name, size, "measured (quiet)" if quiet else "measured",
                {name: figure.read(result) for name, figure in FIGURES.items()},
                f"{agree['top_10']:.3f} ({agree['with']})" if agree else "—",
                f"{result['serve']['source_hit_at_10']:.3f}",
            ))
        for size in projected_sizes:
            fits = {name: fit(figure, by_size, size) for name, figure in FIGURES.items()}
            if size not in by_size and fits["build_s"]:
                projected = {figure: fit[0] if fit else None for figure, fit in fits.items()}
                lines.append(table_row(name, size, "projected", projected, "—", "—"))
    return "\n".join(lines)


def fit(figure: Figure, by_size: dict[int, dict], size: int) -> tuple[float, float] | None:
    """(projected value, growth parameter) of a figure at `size`, from an engine's results by size."""
    if figure.follows is None:
        return growth([(n, figure.read(result)) for n, result in by_size.items()], size, figure.model)
    leader = FIGURES[figure.follows]
    leader_fit = fit(leader, by_size, size)
    if leader_fit is None:
        return None
    largest = by_size[max(by_size)]
    ratio = leader_fit[0] / leader.read(largest)
    return figure.read(largest) * (1 / ratio if figure.inverse else ratio), ratio


def growth_table(results: dict[str, dict[int, dict]]) -> str:
    """The fitted growth behind each projection: the exponent b of a power law (1 = linear in the passages),
    or the increase per million passages of a line."""
    lines = ["| engine | from sizes | " + " | ".join(FIGURES) + " |", "|---|---|" + "---|" * len(FIGURES)]
    for name, by_size in results.items():
        cells = []
        for figure in FIGURES.values():
            fitted = fit(figure, by_size, 1)
            if fitted is None:
                cells.append("—")
            elif figure.follows:
                cells.append(f"∝ {'1/' if figure.inverse else ''}{figure.follows}")
            elif figure.model == POWER:
                cells.append(f"n^{fitted[1]:.2f}")
            else:
                cells.append(f"{fitted[1]:+.2f} {figure.unit} per 1M")
        if len(by_size) > 1:
            sizes = " and ".join(f"{n:,}" for n in sorted(by_size)[-2:])
            lines.append(f"| {name} | {sizes} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def minilm_line(out: Path) -> str | None:
    path = out / "minilm-encoding.json"
    if not path.is_file():
        return None
    rate = json.loads(path.read_text())
    hours = DPR_WIKIPEDIA / rate["passages_per_s"] / 3600
    return (f"MiniLM ({rate['model']}, max {rate['max_seq_length']} tokens, "
            f"{rate['threads']} threads): "
            f"{rate['passages_per_s']:.1f} passages/s on {rate['passages']} 100-word passages, so "
            f"{DPR_WIKIPEDIA:,} passages would take {hours:,.0f} h ({hours / 24:.1f} days) to encode here")


def report(out: Path, projected_sizes: list[int]) -> None:
    results = read_results(out)
    if not results:
        print(f"no results in {out}")
        return
    print(f"top {TOP_K}; latency from 1 and 16 concurrent clients; (quiet): the process named by --pause-pid was "
          "stopped while that row's engine built and served; projected: from the two largest measured sizes, "
          "time, memory and disk as a power law of the passages; 1-client latency as a line, its p99 in proportion; "
          "16-client throughput in inverse proportion to the 1-client median, its latencies in inverse proportion "
          "to the throughput\n")
    print(table(results, projected_sizes))
    print("\nGrowth through the two largest measured sizes (the projections' models):\n")
    print(growth_table(results))
    line = minilm_line(out)
    if line:
        print("\n" + line)
