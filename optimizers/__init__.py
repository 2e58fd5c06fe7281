"""Optimizers: compile a program's prompts with DSPy teleprompters, save and load compiled programs,
tune its declared parameters with Optuna (`tuning/`), and calibrate CRAG's thresholds."""

from arag.optimizers.compile import TELEPROMPTERS, compile
from arag.optimizers.saving import load_program, save_program
from arag.optimizers.tuning import SearchSpace, TuningConfig, tune

__all__ = ["TELEPROMPTERS", "SearchSpace", "TuningConfig", "compile", "load_program", "save_program", "tune"]
