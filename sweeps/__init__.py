"""sweeps: hyperparameter search and stability sweeps for PyTorch training."""

from sweeps.compile import COMPILE_MODES, compile_mode, compile_model
from sweeps.monitor import Monitor
from sweeps.rules.verdict import REASONS, Verdict

__all__ = ["COMPILE_MODES", "Monitor", "REASONS", "Verdict", "compile_mode", "compile_model"]
__version__ = "0.1.0"
