"""One worker thread per device of a hybrid group.

The devices of a group must really run at the same time, forward and
backward.  A worker is a long-lived thread that owns one device: on a CPU
device it runs with one intra-op thread (so K CPU devices use K cores, which
is how the scheme runs and is measured without a GPU); on a CUDA device it
makes that device current and runs on a stream of its own.  The main thread
hands each worker one job per phase and waits for all of them, like
``spawn_workers`` in kakaobrain/torchgpipe ``worker.py``.

Thread-local state that a job depends on (grad mode, autocast, see
:mod:`.thread_state`) is captured on the caller and entered in the job.
Nothing may leave the caller waiting forever:

* a job that raises makes :meth:`WorkerGroup.run` raise the same exception
  in the caller, naming the device;
* a worker whose start-up fails (``torch.cuda.set_device``, stream
  creation) answers every job with that failure;
* a job that does not return within the group's timeout
  (``--hybrid-timeout``) makes the caller raise :class:`WorkerTimeout`,
  naming the device, what it was doing and where its thread stands.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import stream_handoff, thread_state

Job = Callable[[], object]

DEFAULT_TIMEOUT = 1800.0  # seconds; --hybrid-timeout


class WorkerError(RuntimeError):
    """A job failed on one device of a hybrid group."""


class WorkerTimeout(WorkerError):
    """A job did not finish within the group's timeout."""


class Aborted(RuntimeError):
    """Raised in a worker that was waiting on another worker's failed job."""


_local = threading.local()


def current_worker() -> Optional["Worker"]:
    """The worker whose thread this is (None on any other thread)."""
    return getattr(_local, "worker", None)


class StageThread:
    """A stage process's own thread as the worker of its device: what the
    cell graph names its cells on (``cell``, ``activity``), as a
    :class:`Worker` thread has it.  Unlike a worker thread it runs more
    than cells (the wire, the trainer's messages): ``cells_only`` says so."""

    cells_only = False

    def __init__(self, index: int, device: torch.device):
        self.index, self.device, self.cell, self.activity = index, device, None, "idle"


def run_as(worker: "StageThread") -> None:
    """The calling thread is ``worker`` from now on (a stage's, for its life)."""
    _local.worker = worker


class Worker:
    """A thread that runs jobs on one device, one at a time, in order."""

    cells_only = True  # its thread runs the step's jobs alone (StageThread's does more)

    def __init__(self, index: int, device: torch.device):
        self.index = index
        self.device = device
        self.jobs: "queue.Queue" = queue.Queue()
        self.activity = "idle"  # what the worker is doing, for timeout messages
        self.cell: Optional[str] = None  # the cell it runs, when it runs one
        self.streams: Dict[object, object] = {}  # by stream scope (see .streams)
        self.thread = threading.Thread(target=self._loop, name=f"hybrid worker {index} ({device})", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        _local.worker = self
        if self.device.type == "cpu":
            torch.set_num_threads(1)  # per thread with OpenMP: this worker uses one core
        else:
            torch.cuda.set_device(self.device)
            self.streams["cuda"] = stream_handoff.new_stream(self.device)

    def _stream(self):
        """This worker's stream (None on plain CPU): made at start-up on
        CUDA, once per checker on virtual devices."""
        scope = stream_handoff.scope(self.device)
        if scope is None:
            return None
        if scope not in self.streams:
            self.streams[scope] = stream_handoff.new_stream(self.device, f"worker {self.index} stream")
        return self.streams[scope]

    def _run_job(self, job: Job) -> object:
        """``job`` on this worker's stream, ordered after the work the
        caller queued on the device's default stream, and the default
        stream ordered after it (so the caller may use the results)."""
        stream = self._stream()
        with stream_handoff.use_stream(stream):
            if stream is not None:
                stream.wait_stream(stream_handoff.default_stream(self.device))  # the caller's work comes first
            value = job()
            if stream is not None:
                stream_handoff.default_stream(self.device).wait_stream(stream)
        return value

    def _loop(self) -> None:
        try:
            self._start()
            startup_error = None
        except BaseException as error:  # every job is answered with it: never a silent hang
            startup_error = error
        while True:
            job, state, results = self.jobs.get()
            if startup_error is not None:
                results.put((self.index, False, RuntimeError(f"could not start a worker on {self.device}: "
                                                             f"{startup_error}")))
                continue
            try:
                self.activity = "running a job"
                with state.entered():
                    value = self._run_job(job)
                results.put((self.index, True, value))
            except BaseException as error:  # handed to the caller, never lost
                results.put((self.index, False, error))
            finally:
                self.activity, self.cell = "idle", None

    def stack(self) -> str:
        """Where this worker's thread stands now."""
        frame = sys._current_frames().get(self.thread.ident)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(thread not running)\n"


class WorkerGroup:
    """The workers of one list of devices.  ``run`` is serialised, so two
    models placed on the same devices may share a group."""

    def __init__(self, devices: Sequence[torch.device]):
        self.devices = list(devices)
        self.workers = [Worker(index, device) for index, device in enumerate(self.devices)]
        self.lock = threading.Lock()
        self.broken = False

    def run(self, jobs: Sequence[Optional[Job]], on_error: Callable[[], None] = lambda: None,
            timeout: float = DEFAULT_TIMEOUT) -> List[object]:
        """Run ``jobs[i]`` on worker ``i`` (``None``: nothing for it), all at
        once; return their results.  When a job fails, ``on_error`` is called
        (to wake workers waiting on its results) and its exception is raised
        once every job has returned.  When ``timeout`` seconds pass first,
        :class:`WorkerTimeout` is raised and the group is marked broken
        (:func:`worker_group` then starts a new one)."""
        with self.lock:
            if self.broken:
                raise WorkerError("this hybrid worker group timed out before and cannot run again")
            results: "queue.Queue" = queue.Queue()
            state = thread_state.capture()
            pending = set()
            for worker, job in zip(self.workers, jobs):
                if job is not None:
                    worker.jobs.put((job, state, results))
                    pending.add(worker.index)
            values: Dict[int, object] = {}
            failures: List[Tuple[int, BaseException]] = []
            deadline = time.monotonic() + timeout
            while pending:
                try:
                    index, ok, value = results.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    self._time_out(sorted(pending), timeout, on_error)
                pending.discard(index)
                if ok:
                    values[index] = value
                else:
                    if not failures:
                        on_error()
                    failures.append((index, value))
            state.joined()
            if failures:
                index, error = min(failures, key=lambda failure: isinstance(failure[1], Aborted))
                raise WorkerError(f"hybrid worker {index} ({self.devices[index]}) failed: {error}") from error
            return [values.get(index) for index in range(len(self.workers))]

    def _time_out(self, stuck: List[int], timeout: float, on_error: Callable[[], None]) -> None:
        self.broken = True
        reports = [f"hybrid worker {index} ({self.devices[index]}) is still in {self.workers[index].activity}"
                   for index in stuck]
        stacks = "".join(f"\n--- hybrid worker {index} ({self.devices[index]}) ---\n{self.workers[index].stack()}"
                         for index in stuck)
        on_error()  # wake the workers that wait on the stuck ones
        with _groups_lock:
            for key, group in list(_groups.items()):
                if group is self:
                    del _groups[key]
        raise WorkerTimeout(f"{'; '.join(reports)} after {timeout:g} s (--hybrid-timeout){stacks}")


_groups: Dict[Tuple[str, ...], WorkerGroup] = {}
_groups_lock = threading.Lock()


def worker_group(devices: Sequence[torch.device]) -> WorkerGroup:
    """The (shared, long-lived) worker group of a list of devices."""
    key = tuple(str(device) for device in devices)
    with _groups_lock:
        if key not in _groups:
            _groups[key] = WorkerGroup(devices)
        return _groups[key]
