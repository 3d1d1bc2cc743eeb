"""One worker thread per device of a hybrid group.

The devices of a group must really run at the same time, forward and
backward.  A worker is a long-lived thread that owns one device: on a CPU
device it runs with one intra-op thread (so K CPU devices use K cores, which
is how the scheme runs and is measured without a GPU); on a CUDA device it
runs on a stream of its own.  The main thread hands each worker one job per
phase and waits for all of them, like ``spawn_workers`` in
kakaobrain/torchgpipe ``worker.py``.

Thread-local state that a job depends on (grad mode) is carried from the
caller into the job.  A job that raises makes :meth:`WorkerGroup.run` raise
the same exception in the caller, naming the device.
"""

from __future__ import annotations

import queue
import threading
from contextlib import nullcontext
from typing import Callable, Dict, List, Sequence, Tuple

import torch

Job = Callable[[], object]


class WorkerError(RuntimeError):
    """A job failed on one device of a hybrid group."""


class Worker:
    """A thread that runs jobs on one device, one at a time, in order."""

    def __init__(self, index: int, device: torch.device):
        self.index = index
        self.device = device
        self.jobs: "queue.Queue" = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=f"hybrid worker {index} ({device})", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        if self.device.type == "cpu":
            torch.set_num_threads(1)  # per thread with OpenMP: this worker uses one core
            stream = None
        else:
            torch.cuda.set_device(self.device)
            stream = torch.cuda.Stream(self.device)
        while True:
            job, grad_enabled, results = self.jobs.get()
            try:
                with torch.set_grad_enabled(grad_enabled), (
                    torch.cuda.stream(stream) if stream is not None else nullcontext()
                ):
                    if stream is not None:
                        # Work the caller queued on the device comes first.
                        stream.wait_stream(torch.cuda.default_stream(self.device))
                    value = job()
                    if stream is not None:
                        torch.cuda.default_stream(self.device).wait_stream(stream)
                results.put((self.index, True, value))
            except BaseException as error:  # handed to the caller, never lost
                results.put((self.index, False, error))


class WorkerGroup:
    """The workers of one list of devices.  ``run`` is serialised, so two
    models placed on the same devices may share a group."""

    def __init__(self, devices: Sequence[torch.device]):
        self.devices = list(devices)
        self.workers = [Worker(index, device) for index, device in enumerate(self.devices)]
        self.lock = threading.Lock()

    def run(self, jobs: Sequence[Job], on_error: Callable[[], None] = lambda: None) -> List[object]:
        """Run ``jobs[i]`` on worker ``i`` (``None``: nothing for it), all at
        once; return their results.  When a job fails, ``on_error`` is called
        (to wake workers waiting on its results) and its exception is raised
        once every job has returned."""
        with self.lock:
            results: "queue.Queue" = queue.Queue()
            grad_enabled = torch.is_grad_enabled()
            started = 0
            for worker, job in zip(self.workers, jobs):
                if job is not None:
                    worker.jobs.put((job, grad_enabled, results))
                    started += 1
            values: Dict[int, object] = {}
            failures: List[Tuple[int, BaseException]] = []
            for _ in range(started):
                index, ok, value = results.get()
                if ok:
                    values[index] = value
                else:
                    if not failures:
                        on_error()
                    failures.append((index, value))
            if failures:
                first = min(failures, key=lambda failure: isinstance(failure[1], Aborted))
                index, error = first
                raise WorkerError(f"hybrid worker {index} ({self.devices[index]}) failed: {error}") from error
            return [values.get(index) for index in range(len(self.workers))]


class Aborted(RuntimeError):
    """Raised in a worker that was waiting on another worker's failed job."""


_groups: Dict[Tuple[str, ...], WorkerGroup] = {}
_groups_lock = threading.Lock()


def worker_group(devices: Sequence[torch.device]) -> WorkerGroup:
    """The (shared, long-lived) worker group of a list of devices."""
    key = tuple(str(device) for device in devices)
    with _groups_lock:
        if key not in _groups:
            _groups[key] = WorkerGroup(devices)
        return _groups[key]
