"""The race (:func:`.race.race`) for the user's workload, as the rows
``fairseq-hybrid-plan`` prints: each candidate's tokens/s, the fastest,
and every group priced with worker threads of one process and with a
process per device, each as built."""

from __future__ import annotations

import statistics
import time
from typing import Dict, List, Optional, Tuple

from ..command_lines.train_command import PlanError
from ..forecasts.workload import Workload, workload

WORKERS = ("threads", "processes")


def costs_for(own, workload: Workload, host_model: str = "per-device"):
    """The cost set's function of K (:func:`race.set_costs_of`), the
    groups' host read as ``host_model``."""
    from ..forecasts.gpu_costs import REFERENCE_BATCH, set_tokens_per_s
    from ..planning.twin_model import uniform_batch
    from .race import set_costs_of

    tokens_per_s = set_tokens_per_s(own.cost_set, own.one_device_tokens_per_s or own.file_tokens_per_s)
    reference = uniform_batch(*REFERENCE_BATCH)  # the shape the one-GPU rates were measured at
    try:
        return set_costs_of(own.cost_set, workload.model, workload.cfg, reference, own.host_cost, host_model,
                            tokens_per_s)
    except ValueError as error:
        raise PlanError(f"--one-device-tokens-per-s {tokens_per_s:g}: {error}") from error


def priced_rows(load: Workload, own, costs, rank_cost, progress=lambda text: None,
                choices: Optional[Dict[int, Dict]] = None, workers: Optional[str] = None) -> Tuple[List[Dict], str]:
    """The race's rows for ``load`` under ``costs`` (``choices``: the
    groups' choices priced as given, :func:`race.race`; ``workers``: the
    groups'), each with its tokens/s, and the fastest's name."""
    from .race import fastest, race

    rows = race(load.model, load.cfg, costs, own.gpus, load.sentences, load.source, load.target,
                own.micro_batches, None, group_sizes=own.group_sizes, progress=progress, rank_cost=rank_cost,
                choices=choices, workers=workers, batches=load.batches)
    if load.batches:  # each priced on the command's own batches: their mean padded tokens
        tokens = statistics.mean(len(real.sources) * (max(real.sources) + real.width) for real in load.batches)
    else:
        tokens = load.sentences * (load.source + load.target)
    ddp = rows[1] if len(rows) > 1 else None
    table = []
    for row in rows:
        entry = row.as_dict(rows[0], ddp)
        entry["tokens_per_s"] = tokens / row.step.total
        table.append(entry)
    return table, fastest(rows).name


def by_workers(load: Workload, own, progress, costs_of, choices: Optional[Dict[str, Dict[int, Dict]]] = None
               ) -> Tuple[List[Dict], str]:
    """Every group priced twice: its cells run by worker threads of one
    process (``--hybrid-workers threads``) and by a process per device
    (``processes``, as built); one device and DDP are the same either way.
    ``costs_of(workers)``: the costs and the rank's cost model for each;
    ``choices``: by workers, :func:`priced_rows`'s.  The rows and the
    fastest's name."""
    tables = {}
    for workers in WORKERS:
        progress(f"groups with {workers}")
        costs, rank_cost = costs_of(workers)
        tables[workers], _ = priced_rows(load, own, costs, rank_cost, progress,
                                         choices=(choices or {}).get(workers), workers=workers)
    table = [row for row in tables["threads"] if "workers" not in row]  # one device and DDP: the same either way
    for threads, processes in zip(tables["threads"], tables["processes"]):
        if "workers" in threads:
            table += [threads, processes]
    return table, min(table, key=lambda row: row["step_ms"])["name"]


def gpu_costs_of(own, load: Workload):
    """:func:`by_workers`'s ``costs_of`` for a GPU cost set."""
    from ..forecasts.gpu_costs import HOST_MODEL_OF_WORKERS

    return lambda workers: (costs_for(own, load, HOST_MODEL_OF_WORKERS[workers]), None)


def plan(own, args, progress=print, load: Optional[Workload] = None) -> Dict:
    """The race for the user's command: its candidates as rows, the
    fastest's name, and what the prices assumed."""
    load = load or workload(args, own)
    progress(f"[plan] global batch: {load.sentences} sentences ({load.where})")
    costs, rank_cost = own.cpu_costs if own.cpu_costs else (None, None)
    started = time.time()

    def step_progress(text: str) -> None:
        progress(f"[plan] {text} ({time.time() - started:.0f} s so far)")

    if own.cpu_costs and "processes" not in own.calibration:  # a calibration from before processes were priced
        table, fastest_name = priced_rows(load, own, costs, rank_cost, step_progress)
    else:  # own.cpu_costs_of: the commands' function of the workers, for a calibration of CPU devices
        costs_of = own.cpu_costs_of if own.cpu_costs else gpu_costs_of(own, load)
        table, fastest_name = by_workers(load, own, step_progress, costs_of)
    return {"gpus": own.gpus, "cost_set": None if own.cpu_costs else own.cost_set, "cost_file": own.cost_file,
            "measured_on": own.measured_on, "calibration": own.calibration,
            "host_cost": own.host_cost, "sentences": load.sentences,
            "source": load.source, "target": load.target, "shape": load.where, "rows": table,
            "fastest": fastest_name}
