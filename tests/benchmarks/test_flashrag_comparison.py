"""The matrix's F1 beside FlashRAG's: read from the results, with n and the paired difference from single-rag."""

import json
import subprocess
import sys
from pathlib import Path

from arag.data import load_examples

ROOT = Path(__file__).resolve().parents[2]


def write_cell(folder: Path, program: str, ids: list[str], f1: list[float]) -> None:
    rows = [{"id": i, "prediction": "x", "metrics": {"em": s, "f1": s, "match": s}, "steps": {}, "commit": "abc"}
            for i, s in zip(ids, f1)]
    (folder / f"{program}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_each_method_shows_its_f1_its_n_and_its_paired_difference_from_single_rag(shared_dataset, tmp_path):
    ids = [e.id for e in load_examples(str(shared_dataset("hotpotqa") / "public.jsonl"))[:4]]
    hotpotqa = tmp_path / "results" / "hotpotqa"
    hotpotqa.mkdir(parents=True)
    write_cell(hotpotqa, "single-rag", ids, [1.0, 0.0, 1.0, 0.0])
    write_cell(hotpotqa, "flare", ids[:3], [1.0, 1.0, 1.0])
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flashrag_comparison.py"), "--results",
                           str(tmp_path / "results")], capture_output=True, text=True, cwd=ROOT, check=True)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in done.stdout.splitlines()
            if line.startswith("| ")}
    assert rows["single-rag"][1:3] == ["35.3", "50.0 (n 4)"]
    # flare answered 3 of them: differences 0, +1, 0 on those, mean +33.3, resampled from all 0 to all +1
    assert rows["flare"][1:3] == ["28.0", "100.0 (n 3, +33.3 [+0.0, +100.0])"]
    assert rows["ircot"][2] == "—" and rows["ircot"][3] == "32.4"
    assert "1,000 questions" in done.stdout


def test_a_missing_results_folder_is_named(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flashrag_comparison.py"), "--results",
                           str(tmp_path / "none")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and f"no quality results at {tmp_path / 'none'}" in done.stderr
