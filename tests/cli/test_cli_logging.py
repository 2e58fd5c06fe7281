"""The command line's output: arag's own progress lines, and other libraries' notices only with -v."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from arag.cli_logging import QUIET_ENVIRONMENT

NOISE = ("Traceback", "NotImplementedError", "Loading weights", "chttp2_transport", "GOAWAY")


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with none of the quieting variables set, as a user's shell would start it."""
    env = {name: value for name, value in os.environ.items() if name not in QUIET_ENVIRONMENT}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)


def test_library_notices_are_quieted_unless_verbose():
    code = """
import json, logging, os
from arag.cli_logging import QUIET_ENVIRONMENT, configure_logging
configure_logging(verbose={verbose})
print(json.dumps({{"grpc": logging.getLogger("grpc").getEffectiveLevel(),
                   "arag": logging.getLogger("arag").getEffectiveLevel(),
                   "root": logging.getLogger().getEffectiveLevel(),
                   "env": {{name: os.environ.get(name) for name in QUIET_ENVIRONMENT}}}}))
"""
    quiet = json.loads(run_python(code.format(verbose=False)).stdout)
    assert quiet["grpc"] == 50 and quiet["arag"] == 20 and quiet["root"] == 30
    assert quiet["env"] == QUIET_ENVIRONMENT
    verbose = json.loads(run_python(code.format(verbose=True)).stdout)
    assert verbose["grpc"] == verbose["root"] == verbose["arag"] == 20
    assert set(verbose["env"].values()) == {None}


@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in ("pymilvus", "milvus_lite",
                                                                            "sentence_transformers")),
                    reason="needs the milvus and dense extras")
def test_a_milvus_build_prints_its_progress_and_no_library_noise(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": f"Title {i}", "text": f"passage {i} about rivers"})
                              + "\n" for i in range(20)))
    target = f"{tmp_path / 'passages.db'}#wiki"
    built = run_python("import sys; from arag.cli import main; sys.argv[0] = 'arag'; main()",
                       "index", "build", "--kind", "milvus", "--corpus", str(corpus), "--out", target)
    assert built.returncode == 0, built.stderr
    assert f"built milvus index at {target}" in built.stdout
    assert "arag: milvus build: 20 passages" in built.stderr
    assert not [noise for noise in NOISE if noise in built.stdout + built.stderr], built.stderr
