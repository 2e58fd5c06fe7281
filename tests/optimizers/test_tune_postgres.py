"""Two worker processes tuning one study in PostgreSQL share its trials: exactly N, none run twice.

Needs a server: ARAG_TEST_POSTGRES_URL (scripts/start-postgres.sh starts one and prints its URL).
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import optuna
import pytest

from arag.data import load_corpus, sample_paths
from arag.optimizers.tuning.study import rdb_url
from arag.retrievers import BM25Retriever

POSTGRES_URL = os.environ.get("ARAG_TEST_POSTGRES_URL")
TRIALS = 10

pytestmark = [
    pytest.mark.skipif(not POSTGRES_URL,
                       reason="no PostgreSQL server: export ARAG_TEST_POSTGRES_URL=$(scripts/start-postgres.sh)"),
    pytest.mark.skipif(not any(importlib.util.find_spec(driver) for driver in ("psycopg", "psycopg2")),
                       reason="no PostgreSQL driver: pip install 'psycopg[binary]'"),
]

WORKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path

    from arag.data import load_examples, sample_paths
    from arag.optimizers.tuning import SearchSpace, TuningConfig, tune
    from arag.retrievers import BM25Retriever
    from arag.testing import scripted_lm

    url, study, index, out, seed, trials, ready, go = sys.argv[1:]
    questions, _ = sample_paths()
    examples = load_examples(questions, limit=6)
    retriever = BM25Retriever.load(Path(index))

    def responder(call):
        passages = json.loads(call.inputs["passages"])
        return {f: "Danube" if f == "answer" and len(passages) <= 4 else "." for f in call.output_fields}

    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.01)
    space = SearchSpace(ranges={"k": (1, 8)}, fixed={"reasoning": "direct"})
    config = TuningConfig(trials=int(trials), out_dir=out, objectives=("f1",), space=space, storage=url,
                          study_name=study, seed=int(seed), plots=False)
    result = tune("single-rag", examples, retriever, config, lm=scripted_lm(responder, latency=0.01))
    print(json.dumps(result.ran))
""")


def test_two_workers_complete_exactly_n_trials_of_one_study_none_twice(tmp_path):
    index = tmp_path / "bm25"
    BM25Retriever.build(load_corpus(sample_paths()[1]), index)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    study = f"arag-test-{uuid.uuid4().hex[:12]}"
    go = tmp_path / "go"
    workers, ready = [], []
    for number in range(2):
        ready.append(tmp_path / f"ready-{number}")
        argv = [sys.executable, str(script), POSTGRES_URL, study, str(index), str(tmp_path / f"out-{number}"),
                str(number), str(TRIALS), str(ready[-1]), str(go)]
        workers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 120
    while not all(path.exists() for path in ready) and time.time() < deadline:
        assert all(w.poll() is None for w in workers), [w.communicate() for w in workers if w.poll() is not None]
        time.sleep(0.02)
    go.touch()
    ran = []
    for worker in workers:
        out, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err
        ran.append(json.loads(out.strip().splitlines()[-1]))

    storage = optuna.storages.RDBStorage(rdb_url(POSTGRES_URL))
    trials = optuna.load_study(study_name=study, storage=storage).get_trials()
    finished = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(finished) == TRIALS
    assert all(ran), f"a worker ran no trial: {ran}"
    assert not set(ran[0]) & set(ran[1]), "a trial ran in both workers"
    assert sorted(ran[0] + ran[1]) == sorted(t.number for t in finished)
    for number, numbers in enumerate(ran):
        workers_seen = {t.user_attrs["arag"]["worker"] for t in finished if t.number in numbers}
        assert len(workers_seen) == 1, f"worker {number}'s trials name several processes: {workers_seen}"
    others = [t for t in trials if t not in finished]
    assert all(t.user_attrs.get("arag", {}).get("note") == "study full: not run" for t in others)
