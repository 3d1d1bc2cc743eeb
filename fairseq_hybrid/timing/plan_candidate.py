"""One candidate of ``fairseq-hybrid-plan --measure``, timed in a process
of its own (the benchmark suite's way: a fresh process per run, so one
run's threads, allocator and caches do not carry into the next)::

    python -m fairseq_hybrid.timing.plan_candidate '{"kind": "group", ...}'

prints ``RESULT {...}``: the seconds and the padded tokens (sentences
times source plus target width, as the plan counts them) of the timed
steps.  Every candidate trains the model of the user's fairseq-train
command on the same batches: the first ``batches`` that fairseq's sampler
draws for that command (seed 1), the batches the plan reads its shape
from, after ``warmup`` untimed steps on the first of them, with Adam.

Kinds:

* ``one``: the model on one device, ``threads`` intra-op threads (on CPU
  devices all of them: the other way to use the cores).
* ``group``: one hybrid group of the devices, with the chunk length,
  micro-batches and placement the plan chose for it.
* ``ranks``: ``ranks`` processes (gloo on CPU, NCCL on CUDA), each training
  its share of every batch's sentences, so that the global batch stays the
  user's: plain DDP where a rank has one device (PyTorch's
  DistributedDataParallel, fairseq's default), groups under DDP where it
  has several (the gradients all-reduced after the backward pass, as
  fairseq's ``legacy_ddp`` does for groups).
* ``calibrate`` (CPU devices): the cost model the plan prices CPU devices
  with, measured here (:mod:`fairseq_hybrid.timing.cpu_calibration`) on
  other batches (seed 2) than the ones timed.
* ``gpu_calibrate``: a GPU cost file's measurements
  (:mod:`fairseq_hybrid.timing.gpu_calibration`).
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import sys
import threading
import time
from typing import Dict, List, Sequence

import torch

from ..forecasts.data_parallel_cost import BUCKET_BYTES, gradient_bytes
from . import ddp_rank
from ..command_lines.train_command import command_batches
from .training_steps import share_of, spawned, train_steps

__all__ = ["build", "padded_tokens", "main"]

REPEATS = 2  # passes of each whole-step timing in the calibration


def build(train: List[str], devices: Sequence[str], group: Dict = None, with_batches: bool = True):
    """Task (its train split loaded ``with_batches``), model (seed 1) and
    criterion of the user's command on ``devices``: one device, or a hybrid
    group with ``group``'s choices."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from .. import models  # noqa: F401  (registers hybrid_lstm)

    args = list(train)
    if all(device == "cpu" for device in devices):
        args.append("--cpu")
    if len(devices) > 1 or group:
        group = group or {}
        args += ["--hybrid-devices", ",".join(devices),
                 "--hybrid-chunk-length", str(group.get("chunk_length", 0)),
                 "--hybrid-micro-batches", str(group.get("micro_batches", 1)),
                 "--hybrid-softmax-chunks", str(group.get("softmax_chunks", 1))]
        if group.get("placement"):
            args += ["--hybrid-placement", group["placement"]]
        if group.get("workers"):
            args += ["--hybrid-workers", group["workers"]]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), args))
    task = tasks.setup_task(cfg.task)
    if with_batches:
        task.load_dataset(cfg.dataset.train_subset)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    if len(devices) == 1 and not group and devices[0] != "cpu":
        model = model.to(devices[0])
    return task, cfg, model, task.build_criterion(cfg.criterion)


def drawn(task, cfg, count: int, seed: int = 1):
    return command_batches(task, cfg.dataset.max_tokens, cfg.dataset.batch_size, count, seed,
                           cfg.dataset.train_subset)


def padded_tokens(samples: Sequence[Dict]) -> int:
    """Sentences times source plus target width, summed: the plan's count."""
    return sum(s["target"].size(0) * (s["net_input"]["src_tokens"].size(1) + s["target"].size(1)) for s in samples)


def timed(model, criterion, optimizer, samples, warmup: int, device: str) -> float:
    train_steps(model, criterion, optimizer, samples[:warmup], device)
    return train_steps(model, criterion, optimizer, samples, device)[1]


def run_in_process(spec: Dict) -> Dict:
    """``one`` or ``group``: one device, or one group of the devices."""
    torch.set_num_threads(spec["threads"])
    group = spec["group"] if spec["kind"] == "group" else None
    task, cfg, model, criterion = build(spec["train"], spec["devices"] if group else spec["devices"][:1], group)
    samples = drawn(task, cfg, spec["batches"])
    device = spec["devices"][0]  # fairseq's trainer puts a batch on the first GPU; a group takes it from there
    seconds = timed(model, criterion, torch.optim.Adam(model.parameters(), lr=1e-3), samples, spec["warmup"], device)
    return {"seconds": seconds, "tokens": padded_tokens(samples), "steps": len(samples)}


class ReducedBeforeStep:
    """An optimizer that sums the gradients over the ranks before its step,
    a flat buffer per device (fairseq's ``legacy_ddp``: after the whole
    backward pass, in one go)."""

    def __init__(self, optimizer, parameters):
        self.optimizer, self.parameters = optimizer, list(parameters)

    def step(self):
        import torch.distributed as dist

        by_device: Dict[torch.device, List[torch.Tensor]] = {}
        for parameter in self.parameters:
            if parameter.grad is not None:
                by_device.setdefault(parameter.grad.device, []).append(parameter.grad)
        for grads in by_device.values():
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            for grad, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                grad.copy_(reduced)
        self.optimizer.step()


def rank_process(rank: int, spec: Dict, results) -> None:
    """One rank of a ``ranks`` candidate."""
    ranks = spec["ranks"]
    per = len(spec["devices"]) // ranks
    mine = spec["devices"][rank * per:(rank + 1) * per]
    cuda = mine[0].startswith("cuda")
    torch.set_num_threads(spec["threads"])
    if cuda:
        torch.cuda.set_device(torch.device(mine[0]))
    ddp_rank.join(rank, ranks, spec["port"], "nccl" if cuda else "gloo")
    task, cfg, model, criterion = build(spec["train"], mine, spec["group"] if per > 1 else None)
    pad = task.target_dictionary.pad()
    samples = [share_of(sample, rank, ranks, pad) for sample in drawn(task, cfg, spec["batches"])]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if per == 1:
        loss = ddp_rank.ddp_loss(model, criterion, [mine[0]] if cuda else None)
    else:
        loss, optimizer = criterion, ReducedBeforeStep(optimizer, model.parameters())
    _, seconds = ddp_rank.timed_steps(model, loss, optimizer, samples[:spec["warmup"]], samples, mine[0])
    results.put((rank, seconds, padded_tokens(samples)))


def run_ranks(spec: Dict) -> Dict:
    rows = spawned(rank_process, (spec,), spec["ranks"])
    return {"seconds": max(row[1] for row in rows), "tokens": sum(row[2] for row in rows), "steps": spec["batches"]}


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
    all-reduce of the model's gradients between K processes."""
    from .cpu_calibration import fitted_cost, ring_bandwidth
    from .worker_costs import worker_costs

    k = len(spec["devices"])
    say = lambda text: print(f"[calibrate] {text}", file=sys.stderr, flush=True)  # noqa: E731
    task, cfg, engine, criterion = build(spec["train"], ["cpu"], {"chunk_length": 0})
    plain = [build(spec["train"], ["cpu"])[2:] for _ in range(k)]
    samples = drawn(task, cfg, spec["batches"] + 1, seed=2)
    warm, samples = samples[:1], samples[1:]
    optimizer = torch.optim.Adam(engine.parameters(), lr=1e-3)
    optimizers = [torch.optim.Adam(model.parameters(), lr=1e-3) for model, _ in plain]
    torch.set_num_threads(1)
    train_steps(engine, criterion, optimizer, warm)
    for (model, loss), each in zip(plain, optimizers):
        train_steps(model, loss, each, warm)
    say("the engine's cells with one thread")
    one = fitted_cost(engine, criterion, optimizer, samples, threads=1, group_threads=k,
                      what="the command's model")
    say(f"the engine and the model without it with 1 and {k} threads, {k} copies at once")
    # each the faster of two passes, alternating: another tenant of the machine only ever slows a pass
    engine_seconds, alone, all_threads = (float("inf"),) * 3
    for _ in range(REPEATS):
        torch.set_num_threads(1)
        engine_seconds = min(engine_seconds, train_steps(engine, criterion, optimizer, samples)[1])
        alone = min(alone, train_steps(*plain[0], optimizers[0], samples)[1])
        torch.set_num_threads(k)
        all_threads = min(all_threads, train_steps(*plain[0], optimizers[0], samples)[1])
    torch.set_num_threads(1)
    together = [0.0] * k

    def work(index):
        torch.set_num_threads(1)  # OpenMP's thread count is each thread's own: a new thread starts with all cores
        together[index] = train_steps(*plain[index], optimizers[index], samples)[1]

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
            measured = timed(model, criterion, optimizer, samples, 1, "cpu") / len(samples)
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


def run_gpu_calibrate(spec: Dict) -> Dict:
    from .gpu_calibration import run

    return run(spec, build)


RUNS = {"one": run_in_process, "group": run_in_process, "ranks": run_ranks, "calibrate": run_calibrate,
        "gpu_calibrate": run_gpu_calibrate}


def main(argv=None) -> int:
    import logging

    logging.disable(logging.WARNING)
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    print("RESULT " + json.dumps(RUNS[spec["kind"]](spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
