"""The calibrations ``fairseq-hybrid-plan`` runs, each in a process of
its own (:mod:`fairseq_hybrid.candidates.run_one`): CPU devices' cost model
(``calibrate``, what ``--measure`` and ``calibrate cpu,...`` price with)
and a GPU cost file's measurements (``gpu_calibrate``)."""

from __future__ import annotations

import datetime
import gc
import math
import statistics
import sys
import threading
import time
from typing import Dict

import torch

from ..forecasts.data_parallel_cost import BUCKET_BYTES, gradient_bytes
from .command_model import build, drawn, timed
from .training_steps import spawned, train_steps

__all__ = ["run_calibrate", "run_gpu_calibrate", "CALIBRATIONS"]

REPEATS = 2  # passes of each whole-step timing in the calibration


def reduce_process(rank: int, ranks: int, nbytes: int, port: int, results) -> None:
    """Time gloo's all-reduce of ``nbytes`` in DDP's buckets between ``ranks``
    processes, nothing else running (median of 5 after a warm-up)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks,
                            timeout=datetime.timedelta(minutes=5))
    buckets = max(1, math.ceil(nbytes / BUCKET_BYTES))
    pieces = [torch.ones(nbytes // 4 // buckets) for _ in range(buckets)]
    times = []
    for _ in range(6):
        dist.barrier()
        start = time.perf_counter()
        for piece in pieces:
            dist.all_reduce(piece)
        times.append(time.perf_counter() - start)
    results.put(statistics.median(times[1:]))
    dist.destroy_process_group()


def run_calibrate(spec: Dict) -> Dict:
    """The plan's cost model of this machine's CPU devices, on other batches
    than the timed ones: the engine's cells on one device fitted with one
    thread (the main thread of a group's time outside the cells measured
    with K); the model as one device and DDP's ranks run it (fairseq's
    modules, no engine) timed with one thread and with all K, against the
    engine; each device's slowdown when K such copies train at once; gloo's
    all-reduce of the model's gradients between K processes; a group of
    each kind of workers and DDP's ranks (timed first) against their
    prices."""
    from .cpu_calibration import fitted_cost, ring_bandwidth
    from .worker_costs import worker_costs

    k = len(spec["devices"])
    say = lambda text: print(f"[calibrate] {text}", file=sys.stderr, flush=True)  # noqa: E731
    task, cfg, engine, criterion = build(spec["train"], ["cpu"], {"chunk_length": 0})
    plain = [build(spec["train"], ["cpu"])[2:] for _ in range(k)]
    samples = drawn(task, cfg, spec["batches"] + 1, seed=2)
    warm, samples = samples[:1], samples[1:]
    if k > 1:  # first, before this process trains anything: after that, its ranks ran slower (docs/benchmarks.md)
        say(f"DDP's {k} ranks")
        rank_seconds = ranks_step_seconds(spec, warm + samples)
    optimizer = torch.optim.Adam(engine.parameters(), lr=1e-3)
    optimizers = [torch.optim.Adam(model.parameters(), lr=1e-3) for model, _ in plain]
    # the model with all K threads before this process runs anything with one, as a fresh process does
    # (one device as --measure and fairseq-train run it): a process that trained with one thread first timed
    # it 10-20% slower at K (docs/benchmarks.md); the faster of the passes, another tenant only slows one
    say(f"the model without the engine with {k} threads")
    torch.set_num_threads(k)
    train_steps(*plain[0], optimizers[0], warm)
    all_threads = min(train_steps(*plain[0], optimizers[0], samples)[1] for _ in range(REPEATS))
    torch.set_num_threads(1)
    train_steps(engine, criterion, optimizer, warm)
    for (model, loss), each in zip(plain, optimizers):
        train_steps(model, loss, each, warm)
    say("the engine's cells with one thread")
    one = fitted_cost(engine, criterion, optimizer, samples, threads=1, group_threads=k,
                      what="the command's model")
    say(f"the engine and the model without it with 1 thread, {k} copies at once")
    # each the faster of two passes, alternating: another tenant of the machine only ever slows a pass
    engine_seconds, alone = (float("inf"),) * 2
    for _ in range(REPEATS):
        engine_seconds = min(engine_seconds, train_steps(engine, criterion, optimizer, samples)[1])
        alone = min(alone, train_steps(*plain[0], optimizers[0], samples)[1])
    together = [0.0] * k

    def work(index):
        torch.set_num_threads(1)  # OpenMP's thread count is each thread's own: a new thread starts with all cores
        together[index] = train_steps(*plain[index], optimizers[index], samples, collect=False)[1]

    gc.collect()  # once before the threads start: a collection in one would stop the others mid-step
    pool = [threading.Thread(target=work, args=(index,)) for index in range(k)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    say(f"gloo's all-reduce between {k} processes")
    nbytes = int(gradient_bytes(engine))
    reduce_seconds = max(spawned(reduce_process, (k, nbytes, spec["port"]), k))
    say("a process per device: a stage's build, its messages, the trainer's commands")
    command_bytes = sum(value.numel() * value.element_size() for value in samples[0]["net_input"].values()
                        if isinstance(value, torch.Tensor))
    layers = (len(engine.encoder.stack.layers), len(engine.decoder.stack.layers))
    processes = worker_costs(engine, layers, samples[:2], command_bytes)
    calibration = {"one_thread": one.__dict__, "processes": processes, "engine_seconds": engine_seconds,
                   "plain_seconds": alone,
                   "plain_all_threads_seconds": all_threads, "together_seconds": together,
                   "slowdown": statistics.mean(together) / alone, "threads": k,
                   "reduce_bytes": nbytes, "reduce_seconds": reduce_seconds,
                   "reduce_bandwidth": ring_bandwidth(nbytes, k, reduce_seconds) if k > 1 else float("inf"),
                   "batches": len(samples)}
    if k > 1:
        say(f"a group of {k} with threads and with processes, against their prices")
        calibration["group_residual"] = group_residuals(spec, calibration, samples)
        calibration["rank_residual"] = rank_residual(rank_seconds, calibration, engine, cfg, task, warm + samples)
    return calibration


def group_residuals(spec: Dict, calibration: Dict, samples) -> Dict[str, float]:
    """For each kind of workers, what a group of the calibration's devices
    (default options) measured a step on the calibration's batches beyond
    what the calibration so far prices it at: what neither the cells' fit
    nor the measured costs of processes hold (worker threads taking turns
    on one interpreter, three processes on the cores, messages and
    commands in a busy step); the prices add it to the group's step.  A
    message's send is priced at what the group's stages took a send in
    these steps (their wires' own timers), not the idle pair's."""
    from ..parallel import DevicePlanError
    from ..planning.schedule_simulator import step_time
    from .cpu_calibration import cpu_costs

    residuals = {}
    for workers in ("threads", "processes"):
        model = None
        for size in range(len(spec["devices"]), 1, -1):  # the largest group the model has layers for
            try:
                _, _, model, criterion = build(spec["train"], spec["devices"][:size], {"workers": workers},
                                               with_batches=False)
                break
            except DevicePlanError:
                continue
        if model is None:
            return {}
        group = model.hybrid_group
        try:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            # the mean of two passes after a warm-up step: a pass as --measure times a candidate (the
            # faster of two priced the groups a tenth faster than --measure then measured them,
            # host-bound), two for half the variance of one
            measured = statistics.mean(timed(model, criterion, optimizer, samples, 1 - attempt, "cpu")
                                       for attempt in range(REPEATS)) / len(samples)
            if group.stages is not None and group.stages.sent_so_far[0]:
                # a send in a busy step: what the stages' own timers say, beside the idle pair's measurement
                messages, _, seconds = group.stages.sent_so_far
                calibration["processes"].update(idle_message_send=calibration["processes"]["message_send"],
                                                message_send=seconds / messages)
        finally:
            if group.stages is not None:
                group.stages.close()
        cost = cpu_costs(calibration, workers)[0](group.plan.size)[0]
        priced = statistics.mean(step_time(model, group.plan, sample["net_input"], sample["target"], cost).total
                                 for sample in samples)
        residuals[workers] = measured - priced
    return residuals


def ranks_step_seconds(spec: Dict, samples) -> float:
    """Seconds a step of DDP's ranks (one a device, each a process,
    ``timing.ddp_rank``) on ``samples``, the calibration's own batches,
    timed as ``--measure`` times DDP: one pass after a warm-up step, the
    slowest rank's."""
    from .ddp_rank import free_port, in_ranks

    run = {"train": spec["train"], "devices": list(spec["devices"]), "group": None, "threads": 1,
           "batches": len(samples), "warmup": 1, "seed": 2, "ranks": len(spec["devices"]), "port": free_port()}
    return in_ranks(run)["seconds"] / len(samples)


def rank_residual(measured: float, calibration: Dict, engine, cfg, task, samples) -> float:
    """What DDP's ranks measured a step (``measured``,
    :func:`ranks_step_seconds`) beyond the price of their shares of
    ``samples`` under the calibration's rank cost: what the cells' fit and
    gloo's idle all-reduce do not hold (DDP's hooks and buckets, the
    all-reduce beside a busy rank, processes on the cores); the rank's
    price adds it to its step."""
    from ..forecasts.data_parallel_cost import data_parallel_step_of
    from ..forecasts.gpu_costs import predicted_step
    from .cpu_calibration import cpu_costs
    from .training_steps import share_of

    k = calibration["threads"]  # the devices, a rank each
    rank = cpu_costs(calibration)[1]
    pad, nbytes = task.target_dictionary.pad(), gradient_bytes(engine)
    priced = statistics.mean(
        data_parallel_step_of([predicted_step(engine, cfg.model, 1, "hybrid", rank, share["net_input"], share["target"])
                               for share in (share_of(sample, r, k, pad) for r in range(k))], nbytes, rank).total
        for sample in samples)
    return measured - priced


def run_gpu_calibrate(spec: Dict) -> Dict:
    from .gpu_calibration import run

    return run(spec)


CALIBRATIONS = {"calibrate": run_calibrate, "gpu_calibrate": run_gpu_calibrate}
