"""Named local models: parts found in installed packages, joined once, checked, never half-written."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from arag.cli import main
from arag.errors import ConfigError
from arag.lm import local_models
from arag.lm.local_models import NamedModel, assemble, model_path, model_status


def install_fake_part(site: Path, package: str, index: int, data: bytes) -> Path:
    """A distribution as pip leaves it: the part's file and a dist-info whose RECORD holds its sha256."""
    module = package.replace("-", "_")
    part = site / module / "data" / f"part{index:02d}.bin"
    part.parent.mkdir(parents=True)
    part.write_bytes(data)
    info = site / f"{module}-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.2.0\n")
    recorded = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"{module}/data/part{index:02d}.bin,sha256={recorded},{len(data)}\n"
                                 f"{module}-0.2.0.dist-info/METADATA,,\n")
    return part


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A three-part model installed in a site folder of its own, and a models folder for it."""
    site = tmp_path / "site"
    chunks = [b"GGUF" + bytes(range(200)), bytes(reversed(range(256))) * 3, b"tail"]
    parts = [install_fake_part(site, f"tiny-part{i}", i, chunk) for i, chunk in enumerate(chunks, 1)]
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("ARAG_MODELS", str(tmp_path / "models"))
    whole = b"".join(chunks)
    model = NamedModel(name="tiny", summary="three parts", size=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
                       packages=("tiny-part1", "tiny-part2", "tiny-part3"), extra="tiny")
    monkeypatch.setitem(local_models.MODELS, "tiny", model)
    return model, parts, whole


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_parts_are_joined_once_in_order_into_the_models_folder(tiny, tmp_path):
    model, _, whole = tiny
    assert model_status(model).detail == "parts installed; assembled on first use"
    path = model_path("tiny")
    assert path == tmp_path / "models" / "tiny.gguf" and path.read_bytes() == whole
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert leftovers(tmp_path / "models") == ["tiny.gguf", "tiny.gguf.verified.json"]
    modified = path.stat().st_mtime_ns
    assert model_path("tiny") == path and path.stat().st_mtime_ns == modified  # reused, not joined again
    status = model_status(model)
    assert status.ready and status.path == path


def test_a_damaged_part_is_named_and_nothing_is_left_behind(tiny, tmp_path):
    _, parts, _ = tiny
    parts[1].write_bytes(parts[1].read_bytes()[:-1] + b"!")
    with pytest.raises(ConfigError) as error:
        model_path("tiny")
    message = str(error.value)
    assert "sha256" in message and "tiny-part2 changed since pip installed it" in message
    assert "tiny-part1" not in message and "tiny-part3" not in message
    assert leftovers(tmp_path / "models") == []


def test_parts_that_are_not_the_models_say_so(tiny, tmp_path, monkeypatch):
    model, _, _ = tiny
    monkeypatch.setitem(local_models.MODELS, "tiny", NamedModel(**{**model.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ConfigError, match="the installed parts are not the model's: pip install 'dspy-arag\\[tiny\\]'"):
        model_path("tiny")
    assert leftovers(tmp_path / "models") == []


def test_a_missing_part_is_named_with_the_install_command(tiny, tmp_path, monkeypatch):
    model, _, _ = tiny
    with_missing = NamedModel(**{**model.__dict__, "packages": (*model.packages, "tiny-part4")})
    monkeypatch.setitem(local_models.MODELS, "tiny", with_missing)
    with pytest.raises(ConfigError, match="needs the package tiny-part4, which is not installed: "
                                          "pip install 'dspy-arag\\[tiny\\]'"):
        model_path("tiny")
    assert "1 of 4 parts not installed (first: tiny-part4)" in model_status(with_missing).detail
    assert leftovers(tmp_path / "models") == []


def test_an_interrupted_assembly_leaves_no_file_that_passes_for_the_model(tiny, tmp_path, monkeypatch):
    model, _, _ = tiny
    target = tmp_path / "models" / "tiny.gguf"
    reads = []
    original_open = open

    def failing_open(path, *args, **kwargs):
        if str(path).endswith("part03.bin"):
            reads.append(path)
            raise OSError("the disk went away")
        return original_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(OSError, match="the disk went away"):
        assemble(model, target)
    assert reads and leftovers(tmp_path / "models") == []


def test_a_truncated_file_in_the_models_folder_is_rebuilt(tiny, tmp_path):
    _, _, whole = tiny
    target = tmp_path / "models" / "tiny.gguf"
    target.parent.mkdir()
    target.write_bytes(whole[:10])
    assert not model_status(local_models.MODELS["tiny"]).ready
    assert model_path("tiny").read_bytes() == whole


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ConfigError, match="no local model named 'nope': known names are smollm2-135m, "
                                          "qwen2.5-coder-1.5b"):
        model_path("nope")


def test_models_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ARAG_MODELS", raising=False)
    monkeypatch.setenv("ARAG_HOME", str(tmp_path / "home"))
    assert local_models.models_folder() == tmp_path / "home" / "models"
    monkeypatch.setenv("ARAG_MODELS", str(tmp_path / "elsewhere"))
    assert local_models.models_folder() == tmp_path / "elsewhere"


def test_arag_models_lists_each_model_and_whether_it_is_ready(tiny, tmp_path):
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0, result.output
    assert "local:smollm2-135m (--lm local)" in result.output
    assert "local:qwen2.5-coder-1.5b" in result.output
    assert "local:tiny" in result.output and "parts installed; assembled on first use" in result.output
    assert str(tmp_path / "models" / "tiny.gguf") in result.output


@pytest.mark.skipif(not all(local_models._installed(p) for p in local_models.MODELS["qwen2.5-coder-1.5b"].packages),
                    reason="the 1.5B model's parts are not installed (pip install 'dspy-arag[qwen]')")
def test_the_real_parts_join_into_the_published_model(tmp_path, monkeypatch):
    monkeypatch.setenv("ARAG_MODELS", str(tmp_path))
    path = model_path("qwen2.5-coder-1.5b")
    assert path.stat().st_size == 1_117_320_768 and path.read_bytes()[:4] == b"GGUF"


def hash_calls(monkeypatch) -> list[Path]:
    """Counts the files whose sha256 the module computes."""
    calls = []
    original = local_models.file_sha256

    def counting(path):
        calls.append(Path(path))
        return original(path)

    monkeypatch.setattr(local_models, "file_sha256", counting)
    return calls


def test_a_file_of_the_right_size_that_is_not_the_model_is_not_ready_and_is_assembled_again(tiny, tmp_path):
    model, _, whole = tiny
    target = tmp_path / "models" / "tiny.gguf"
    target.parent.mkdir()
    target.write_bytes(bytes(len(whole)))  # zeros, the model's size
    status = model_status(model)
    assert not status.ready and "not the model" in status.detail and "assembled again on first use" in status.detail
    assert model_path("tiny").read_bytes() == whole


def test_a_link_to_another_file_is_refused_and_left_alone(tiny, tmp_path):
    model, _, whole = tiny
    theirs = tmp_path / "theirs.gguf"
    theirs.write_bytes(b"x" * len(whole))
    target = tmp_path / "models" / "tiny.gguf"
    target.parent.mkdir()
    target.symlink_to(theirs)
    status = model_status(model)
    assert not status.ready and f"links to {theirs}" in status.detail
    with pytest.raises(ConfigError, match=f"{target} links to {theirs}, which is not the model tiny .*remove the link"):
        model_path("tiny")
    assert target.is_symlink() and theirs.read_bytes() == b"x" * len(whole)


def test_the_sha256_is_verified_once_and_again_when_the_file_changes(tiny, tmp_path, monkeypatch):
    model, _, whole = tiny
    path = model_path("tiny")  # assembled: verified as it is written
    record = json.loads(local_models.verified_record(path).read_text())
    assert record == {"size": len(whole), "mtime_ns": path.stat().st_mtime_ns, "sha256": model.sha256}
    calls = hash_calls(monkeypatch)
    assert model_path("tiny") == path and model_status(model).ready and calls == []
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert model_status(model).ready and calls == [path]  # checked again, found right, recorded
    assert model_path("tiny") == path and calls == [path]
    path.write_bytes(bytes(len(whole)))
    assert not model_status(model).ready


def test_an_unwritable_models_folder_is_one_clear_error(tiny, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ARAG_MODELS", str(blocker / "models"))
    with pytest.raises(ConfigError, match=f"cannot assemble the local model tiny in {blocker / 'models'}: .*"
                                          "ARAG_MODELS"):
        model_path("tiny")
    monkeypatch.setenv("ARAG_MODELS", str(tmp_path / "models"))

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(local_models, "process_scratch", refused)
    with pytest.raises(ConfigError, match=f"in {tmp_path / 'models'}: Permission denied; set ARAG_MODELS"):
        model_path("tiny")


def test_an_assembly_killed_midway_leaves_a_leftover_the_next_one_removes(tiny, tmp_path):
    model, parts, whole = tiny
    code = (
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(tmp_path / 'site')!r})\n"
        "from arag.lm import local_models\n"
        f"local_models.MODELS['tiny'] = local_models.NamedModel(**{model.__dict__!r})\n"
        "def hang(*args):\n    print('joined', flush=True)\n    time.sleep(120)\n"
        "local_models.os.replace = hang\n"
        "local_models.model_path('tiny')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "ARAG_MODELS": str(tmp_path / "models")})
    try:
        assert child.stdout.readline().strip() == "joined"
        left = [p for p in (tmp_path / "models").rglob("*") if p.is_file() and p != tmp_path / "models" / "tiny.gguf"]
        assert sum(p.stat().st_size for p in left) >= len(whole)  # the joined parts, not yet in place
    finally:
        child.kill()
        child.wait()
    assert model_path("tiny").read_bytes() == whole
    assert [name for name in leftovers(tmp_path / "models") if name.startswith(".")] == []  # the killed one's is gone
    assert leftovers(tmp_path / "models") == ["tiny.gguf", "tiny.gguf.verified.json"]


def test_two_assemblies_at_once_both_get_the_model(tiny, tmp_path):
    _, _, whole = tiny
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: model_path("tiny"), range(2)))
    assert paths[0] == paths[1] and paths[0].read_bytes() == whole
    assert leftovers(tmp_path / "models") == ["tiny.gguf", local_models.verified_record(paths[0]).name]
