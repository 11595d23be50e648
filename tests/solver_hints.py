"""CP-SAT held to its hint (``_fix_the_hint``), for the optimum's tests of hand-made instances and of
recorded runs."""

from __future__ import annotations

import pytest


def _fix_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    """solve() fixes every hinted variable to its hint: its status is "optimal" exactly when the hint
    (the recorded run's own schedule) is a schedule, "infeasible" when it is not, whatever the load."""
    from ortools.sat.python import cp_model

    class HintOnly(cp_model.CpSolver):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.parameters.fix_variables_to_their_hinted_value = True

    monkeypatch.setattr(cp_model, "CpSolver", HintOnly)
