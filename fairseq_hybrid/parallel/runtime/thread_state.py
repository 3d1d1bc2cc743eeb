"""The caller's thread-local state, carried into a worker's job.

Grad mode, autocast and the current CUDA device are per thread in PyTorch,
so a job that a worker thread runs for the caller would silently run
without them: under fairseq's ``--amp`` (``torch.autocast`` entered by the
task on the calling thread) every cell would compute in fp32.  The caller
therefore captures its state when it hands out jobs, and every job runs
inside it.

Other modules may add state of their own with :func:`register` (the
virtual-device harness does: its dispatch modes are per thread too, and its
stream checker carries the caller's clocks into the jobs and the jobs'
clocks back through :meth:`ThreadState.joined`).
"""

from __future__ import annotations

import threading
from contextlib import ExitStack, contextmanager
from typing import Callable, ContextManager, Iterator, List, NamedTuple, Optional, Tuple

import torch

# A capture hook runs on the calling thread and returns what to enter on
# the worker (or None for nothing).
CaptureHook = Callable[[], Optional[Callable[[], ContextManager]]]
_hooks: List[CaptureHook] = []

AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")


def register(hook: CaptureHook) -> None:
    if hook not in _hooks:
        _hooks.append(hook)


def unregister(hook: CaptureHook) -> None:
    if hook in _hooks:
        _hooks.remove(hook)


class Autocast(NamedTuple):
    device_type: str
    dtype: torch.dtype
    cache_enabled: bool


class ThreadState(NamedTuple):
    grad_enabled: bool
    autocast: Tuple[Autocast, ...]
    extras: Tuple[Callable[[], ContextManager], ...]

    @contextmanager
    def entered(self) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(torch.set_grad_enabled(self.grad_enabled))
            for state in self.autocast:
                stack.enter_context(torch.autocast(state.device_type, dtype=state.dtype,
                                                   cache_enabled=state.cache_enabled))
            for enter in self.extras:
                stack.enter_context(enter())
            yield

    def joined(self) -> None:
        """The caller has every job's result: extras that carry state back
        from the jobs (an extra with a ``joined`` method) take it now."""
        for enter in self.extras:
            joined = getattr(enter, "joined", None)
            if joined is not None:
                joined()


@contextmanager
def extras_entered(state: ThreadState) -> Iterator[None]:
    """Only the registered extras of ``state`` (for Python code that autograd
    runs in a backward pass, where grad mode and autocast are autograd's)."""
    with ExitStack() as stack:
        for enter in state.extras:
            stack.enter_context(enter())
        yield


def capture() -> ThreadState:
    """The calling thread's state, to be entered by :meth:`ThreadState.entered`
    on another thread."""
    autocast = tuple(
        Autocast(device_type, torch.get_autocast_dtype(device_type), torch.is_autocast_cache_enabled())
        for device_type in AUTOCAST_DEVICE_TYPES
        if torch.is_autocast_enabled(device_type)
    )
    extras = tuple(enter for enter in (hook() for hook in _hooks) if enter is not None)
    return ThreadState(torch.is_grad_enabled(), autocast, extras)


class StageHook:
    """What a module adds to a stage process (``--hybrid-workers
    processes``) for the stage's life: state to enter in the stage
    (:meth:`entered`), what the stage reports with each reply
    (:meth:`report`, picklable) and what the trainer does with it
    (:meth:`received`).  The virtual-device harness is one: each stage
    checks its own ops and reports the waits it recorded."""

    def entered(self, device: torch.device) -> ContextManager:
        """Entered by the stage of ``device`` for its life."""
        raise NotImplementedError

    def report(self) -> object:
        return None

    def received(self, stage: int, report: object) -> None:
        pass


_stage_hooks: List[StageHook] = []


def register_stage_hook(hook: StageHook) -> None:
    if hook not in _stage_hooks:
        _stage_hooks.append(hook)


def unregister_stage_hook(hook: StageHook) -> None:
    if hook in _stage_hooks:
        _stage_hooks.remove(hook)


def stage_hooks() -> List[StageHook]:
    """The hooks registered now (a forked stage inherits the trainer's)."""
    return list(_stage_hooks)


_step = threading.local()


def in_step() -> bool:
    """Whether the calling thread is inside a group's step (its staging,
    its cells' forward on the caller's side, the backward pass's hand-off
    and the replicas' reduce): where the host must never wait for a GPU,
    which the virtual-device harness checks."""
    return getattr(_step, "depth", 0) > 0


@contextmanager
def step_scope() -> Iterator[None]:
    """Mark the calling thread as inside a group's step."""
    _step.depth = getattr(_step, "depth", 0) + 1
    try:
        yield
    finally:
        _step.depth -= 1
