"""Tests that load llama.cpp run in child processes: a native crash fails that test and the suite goes on."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def test_a_crash_in_a_local_model_test_fails_that_test_only(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    local_model: loads llama.cpp\n")
    pytester.makepyfile(test_native="""
        import ctypes, os, signal, sys
        import pytest

        @pytest.mark.local_model
        def test_crashes():
            print("loading the model")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGSEGV)

        @pytest.mark.local_model
        def test_fails_as_usual():
            assert 1 + 1 == 3

        @pytest.mark.local_model
        def test_skips():
            pytest.skip("no model here")

        @pytest.mark.local_model
        def test_passes(tmp_path):
            assert tmp_path.exists()

        def test_in_the_parent_process():
            assert "ARAG_TEST_CHILD_REPORTS" not in os.environ
    """)
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=2, failed=2, skipped=1)
    output = result.stdout.str()
    assert "killed by SIGSEGV" in output and "loading the model" in output
    assert "assert (1 + 1) == 3" in output
    assert "no model here" in output
