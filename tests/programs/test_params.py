import optuna
import pytest

from arag.errors import ConfigError
from arag.programs import build_program, get_program
from arag.programs.frame.params import Param, parse_assignments, resolve_params

THETA = Param("theta", 0.8, "confidence threshold", low=0.0, high=1.0)
K = Param("k", 5, "passages", low=1, high=100)
MODE = Param("mode", "masked", "query mode", choices=("masked", "questions"))
FLAG = Param("with_question", False, "prepend the question")


def test_defaults_and_cli_strings_are_coerced():
    got = resolve_params([THETA, K, MODE, FLAG], {"theta": "0.25", "k": "7", "with_question": "true"}, "p")
    assert got == {"theta": 0.25, "k": 7, "mode": "masked", "with_question": True}


@pytest.mark.parametrize(
    "given, fragment",
    [
        ({"theta": 1.5}, "must be in [0.0, 1.0]"),
        ({"theta": "high"}, "must be float"),
        ({"k": 0}, "must be in [1, 100]"),
        ({"k": 2.5}, "must be int"),
        ({"mode": "other"}, "must be one of ['masked', 'questions']"),
        ({"with_question": "maybe"}, "must be bool"),
        ({"thetta": 0.3}, "unknown parameter(s) thetta; known: theta, k, mode, with_question"),
    ],
)
def test_bad_values_name_the_parameter(given, fragment):
    with pytest.raises(ConfigError) as err:
        resolve_params([THETA, K, MODE, FLAG], given, "flare")
    assert fragment in str(err.value)
    assert str(err.value).startswith("flare: ")


def test_search_space_follows_the_declaration():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        values = [p.suggest(trial) for p in (THETA, K, MODE, FLAG)]
        assert 0.0 <= values[0] <= 1.0 and 1 <= values[1] <= 100
        assert values[2] in ("masked", "questions") and values[3] in (False, True)
        study.tell(trial, 0.0)


def test_parse_assignments():
    assert parse_assignments(["k=5", " theta = 0.3 "]) == {"k": "5", "theta": "0.3"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_assignments(["k"])


def test_registry_errors():
    with pytest.raises(ConfigError, match="unknown program 'flair'; known: .*single-rag"):
        get_program("flair")
    with pytest.raises(ConfigError, match="needs a retriever"):
        build_program("single-rag")
    assert build_program("no-retrieval", reasoning="direct").config == {"reasoning": "direct"}
