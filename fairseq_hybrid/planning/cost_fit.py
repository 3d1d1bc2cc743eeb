"""A cost model fitted to cells timed on this machine: per kind of cell
and phase, a rate per floating-point operation, a cost per LSTM time step
and a fixed cost per call, found by least squares after the cells a
robust fit finds far from the others are left out."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from ..parallel import CellTime, Work
from .schedule_simulator import CostModel, flops


OUTLIER_SPREAD = 5.0  # a cell further off the robust fit than this many median deviations is left out
ROBUST_ROUNDS = 20  # reweighted rounds of the robust fit


def fit(samples: Sequence[Tuple[Work, str, float]], step_overhead: float = 0.0) -> CostModel:
    """Least squares per kind and phase: ``seconds = flops / rate +
    per_step * time steps (LSTM cells) + fixed``.  Terms that come out
    negative are dropped and the rest refitted.

    The cells timed far from the others are left out first: a robust fit
    (least absolute deviations, by reweighted least squares) finds where
    most cells lie, the cells further from it than :data:`OUTLIER_SPREAD`
    times the median relative deviation are dropped, and the least-squares
    fit is made on the rest.  A few cells slowed by something else (a page
    fault, a garbage collection, another process taking the core) would
    otherwise pull the fixed cost and the cost per time step, whose split
    decides how a group's many smaller cells are priced, far from where
    the other cells put them."""
    import numpy as np

    groups: Dict[str, List[Tuple[Work, str, float]]] = {}
    for sample in samples:
        groups.setdefault(f"{sample[0].kind}/{sample[1]}", []).append(sample)
    model = CostModel(step_overhead=step_overhead)
    for key, points in groups.items():
        # the terms' columns, one row a cell, made once for every round of the fit
        columns = {"flops": np.array([flops(work, phase) for work, phase, _ in points]),
                   "fixed": np.ones(len(points))}
        if points[0][0].kind == "lstm":
            columns["steps"] = np.array([float(work.sizes[2]) for work, _, _ in points])
        measured = np.array([seconds for _, _, seconds in points])
        weights = np.ones(len(points))
        for _ in range(ROBUST_ROUNDS):
            values = _fit_terms(columns, measured, weights)
            predicted = sum(values[name] * columns[name] for name in values)
            # rows scaled by 1 / sqrt(|residual|): least squares then minimises the absolute deviations
            weights = 1.0 / np.sqrt(np.maximum(np.abs(measured - predicted), 1e-6 * np.maximum(measured, 1e-12)))
        deviation = np.abs(measured - predicted) / np.maximum(measured, 1e-12)
        kept = deviation <= OUTLIER_SPREAD * float(np.median(deviation)) + 1e-9
        if kept.sum() < 3:
            kept[:] = True
        values = _fit_terms({name: column[kept] for name, column in columns.items()}, measured[kept])
        model.rates[key] = 1.0 / values["flops"] if values.get("flops", 0) > 0 else float("inf")
        model.fixed[key] = float(values.get("fixed", 0.0))
        if "steps" in values:
            model.per_step[key] = float(values["steps"])
    return model


def _fit_terms(columns, measured, weights=None) -> Dict[str, float]:
    """Least-squares coefficients of the terms of :func:`fit` (``columns``:
    each term's value per cell; seconds per FLOP, per time step, fixed),
    each row scaled by ``weights`` (all 1 by default), the negative ones
    dropped."""
    import numpy as np

    w = np.ones(len(measured)) if weights is None else np.asarray(weights, dtype=float)
    names = list(columns)
    while True:
        x = np.array([columns[name] for name in names]).T
        coefficients = np.linalg.lstsq(x * w[:, None], measured * w, rcond=None)[0]
        negative = [name for name, value in zip(names, coefficients) if value < 0]
        if not negative or len(names) == 1:
            break
        names.remove(negative[0])
    return {name: float(value) for name, value in zip(names, np.clip(coefficients, 0, None))}


def samples_from_trace(trace: Sequence[CellTime]) -> List[Tuple[Work, str, float]]:
    """``(work, phase, seconds)`` of every recorded cell that has its work."""
    return [(entry.work, entry.phase, entry.end - entry.start) for entry in trace if entry.work is not None]
