"""Sweeps of cells (benchmark x tier x runtime x rollouts x max_concurrent), one results file
per cell, and what is read from those files: the report table, the plot, the comparison.

This package never runs rollouts itself: each cell is one `metrale.runner.run()`. matplotlib is
imported only by `metrale.matrix.plot`, when a plot is drawn.
"""

from metrale.matrix.cellfile import (
    CellResult,
    cell_from_run_dir,
    is_cell_dir,
    is_run_dir,
    read_cell,
    read_cells,
    write_cell,
)
from metrale.matrix.execute import SweepPlan, plan_sweep, run_sweep
from metrale.matrix.sweep import Cell, Sweep, Tier, cell_name

__all__ = [
    "Cell",
    "CellResult",
    "Sweep",
    "SweepPlan",
    "Tier",
    "cell_from_run_dir",
    "cell_name",
    "is_cell_dir",
    "is_run_dir",
    "plan_sweep",
    "read_cell",
    "read_cells",
    "run_sweep",
    "write_cell",
]
