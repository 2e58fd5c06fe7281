"""benchmarks/scale.py: its --quick run end to end (seconds, no timing assertions), and the pieces its
figures rest on: deterministic corpora, the growth fit behind the projections, the pausing of another process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
sys.path.insert(0, str(BENCHMARKS))

import scale  # noqa: E402
import scale_corpus  # noqa: E402
import scale_table  # noqa: E402
from pausing import Pauser  # noqa: E402

needs_datasets = pytest.mark.skipif(not (DATASETS / "hotpotqa").is_dir(), reason=f"{DATASETS} is not present")


@needs_datasets
def test_a_quick_run_measures_the_bm25_engines_and_projects_them(tmp_path):
    """bm25s always; Lucene, compared with it, where its extra is installed."""
    engines = ["bm25s"] + (["lucene"] if importlib.util.find_spec("pyserini") else [])
    command = [sys.executable, str(BENCHMARKS / "scale.py"), "--quick", "--engines", ",".join(engines),
               "--datasets", str(DATASETS), "--work", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = [int(size) for size in scale.QUICK_SIZES.split(",")]
    for name in engines:
        for size in sizes:
            result = json.loads((tmp_path / "results" / f"{name}-{size}.json").read_text())
            assert result["build"]["disk_bytes"] > 0 and result["build"]["build_memory"]["peak"] > 0
            assert result["serve"]["clients_16"]["p99_ms"] >= result["serve"]["clients_16"]["p50_ms"] > 0
            # Every query is the start of a passage in the corpus: BM25 finds nearly all of them.
            assert result["serve"]["source_hit_at_10"] >= 0.9
            assert len(json.loads((tmp_path / "ids" / f"{name}-{size}.json").read_text())) == scale.QUICK_QUERIES
            if name == "lucene":
                assert result["agreement"]["with"] == "bm25s" and result["agreement"]["top_10"] >= 0.7
        assert f"| {name} | {sizes[-1]:,} | measured |" in done.stdout
        assert f"| {name} | {scale_table.DPR_WIKIPEDIA:,} | projected |" in done.stdout


@needs_datasets
def test_corpora_are_the_real_passages_then_synthetic_ones_the_same_every_time(tmp_path):
    real = len(scale_corpus.real_passages(DATASETS))
    size = real + 30
    first = scale_corpus.write_corpus(DATASETS, size, tmp_path / "a.jsonl")
    second = scale_corpus.write_corpus(DATASETS, size, tmp_path / "b.jsonl")
    assert first.read_bytes() == second.read_bytes()
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert len(rows) == len({row["id"] for row in rows}) == size
    assert rows[0]["id"].startswith("hotpotqa-") and rows[real]["id"] == f"synthetic-{real:08d}"
    assert all(len(row["text"].split()) == scale_corpus.SYNTHETIC_WORDS for row in rows[real:])
    measured, warm_up = scale_corpus.queries(DATASETS, 5, 3)
    assert len(measured) == 5 and len(warm_up) == 3
    assert all(len(row["query"]) <= scale_corpus.QUERY_CHARS for row in measured + warm_up)
    assert len({row["source_id"] for row in measured + warm_up}) == 8


def test_the_growth_fits_go_through_the_two_largest_sizes():
    value, exponent = scale_table.growth([(10, 999.0), (100, 20.0), (1000, 200.0)], 10_000)
    assert exponent == pytest.approx(1.0) and value == pytest.approx(2000.0)
    value, exponent = scale_table.growth([(100, 5.0), (10_000, 50.0)], 1_000_000)
    assert exponent == pytest.approx(0.5) and value == pytest.approx(500.0)
    assert scale_table.growth([(100, 5.0)], 1000) is None
    value, per_million = scale_table.growth([(100, 2.0), (200, 3.0)], 400, scale_table.LINEAR)
    assert value == pytest.approx(5.0) and per_million == pytest.approx(10_000)
    value, _ = scale_table.growth([(100, 3.0), (200, 2.0)], 400, scale_table.LINEAR)
    assert value == pytest.approx(2.0)  # a falling line is noise: flat


def test_latencies_at_16_clients_follow_throughput_which_follows_the_1_client_median():
    def result(p50_1, qps_16, p50_16):
        return {"serve": {"clients_1": {"p50_ms": p50_1},
                          "clients_16": {"queries_per_s": qps_16, "p50_ms": p50_16}}}

    by_size = {100: result(1.0, 100.0, 160.0), 200: result(2.0, 50.0, 320.0)}
    assert scale_table.fit(scale_table.FIGURES["p50_1"], by_size, 400)[0] == pytest.approx(4.0)
    assert scale_table.fit(scale_table.FIGURES["qps_16"], by_size, 400)[0] == pytest.approx(25.0)
    assert scale_table.fit(scale_table.FIGURES["p50_16"], by_size, 400)[0] == pytest.approx(640.0)


def test_agreement_of_ids_searched_apart_is_the_mean_share_of_the_top_10():
    from retrieval_agreement import ids_agreement

    reference = [[f"p{i}" for i in range(10)], [f"q{i}" for i in range(10)]]
    mine = [[f"p{i}" for i in range(7)] + ["x", "y", "z"], reference[1][::-1]]
    assert ids_agreement(mine, reference) == pytest.approx((0.7 + 1.0) / 2)
    with pytest.raises(ValueError, match="as many results"):
        ids_agreement(mine, reference[:1])


def test_each_result_gets_its_agreement_with_its_reference_whichever_was_measured_first(tmp_path):
    (tmp_path / "ids").mkdir()
    (tmp_path / "ids" / "lucene-100.json").write_text(json.dumps([["a", "b", "c"], ["d"]]))
    (tmp_path / "ids" / "bm25s-100.json").write_text(json.dumps([["a", "b", "x"], ["d"]]))
    for name in ("lucene", "bm25s", "dense-ivfpq"):
        (tmp_path / f"{name}-100.json").write_text(json.dumps({"engine": name, "size": 100}))
    scale.record_agreements(tmp_path, tmp_path)
    lucene = json.loads((tmp_path / "lucene-100.json").read_text())
    assert lucene["agreement"] == {"with": "bm25s", "top_10": pytest.approx(3 / 20)}
    # bm25s is the reference; dense-flat's ids are missing: no agreement for either.
    assert "agreement" not in json.loads((tmp_path / "bm25s-100.json").read_text())
    assert "agreement" not in json.loads((tmp_path / "dense-ivfpq-100.json").read_text())


def becomes(pid: int, stopped: bool) -> bool:
    """Whether the process is (or is not) stopped within a second: a signal takes a moment to arrive."""
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        if (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T") == stopped:
            return True
        time.sleep(0.01)
    return False


def test_the_paused_process_is_stopped_during_a_phase_and_continued_after_on_error_or_out_of_budget():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        pauser = Pauser(sleeper.pid, budget_s=10)
        with pytest.raises(ZeroDivisionError), pauser.phase():
            assert becomes(sleeper.pid, stopped=True)
            1 / 0
        assert becomes(sleeper.pid, stopped=False)
        with pauser.phase() as record:
            assert becomes(sleeper.pid, stopped=True)
        assert becomes(sleeper.pid, stopped=False)
        assert 0 < record["paused_s"] <= record["seconds"] and pauser.left_s < 10
        short = Pauser(sleeper.pid, budget_s=0.2)
        with short.phase() as record:
            assert becomes(sleeper.pid, stopped=True)
            assert becomes(sleeper.pid, stopped=False)  # continued when the budget ran out, mid-phase
        assert record["paused_s"] == pytest.approx(0.2) and short.left_s == pytest.approx(0)
        with short.phase():
            assert not becomes(sleeper.pid, stopped=True)
    finally:
        sleeper.kill()
        sleeper.wait()
