"""The in-process grid lives in the package (scripts/fens_sweep.py and hetfl.tune use it too); tests import it from here."""

from hetfl.inprocess import InProcessGrid, run_in_process

__all__ = ["InProcessGrid", "run_in_process"]
