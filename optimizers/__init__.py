"""Optimizers: compile a program's prompts with DSPy teleprompters, save and load compiled programs,
and calibrate CRAG's thresholds. Tuning declared parameters with Optuna is the subpackage `tuning/`
(`arag.optimizers.tuning.tune`)."""

from arag.optimizers.compile import TELEPROMPTERS, compile
from arag.optimizers.saving import load_program, save_program

__all__ = ["TELEPROMPTERS", "compile", "load_program", "save_program"]
