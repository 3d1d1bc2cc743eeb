"""Which processes of a multi-process run are still alive, so that a run
that stops because one process (or a whole node) died says which.

When a process of a run over torch.distributed dies, the others learn it
only as a failed collective ("Connection closed by peer"), which names no
rank.  Each process started by ``fairseq-hybrid-train`` therefore keeps a
counter in torchrun's rendezvous store (on ``--master-addr``) that a
thread advances every ``INTERVAL`` seconds; a process whose training fails
reads every counter twice, ``2 * INTERVAL`` apart, and names the ranks
whose counters stood still.  Counters, not clock times: nodes' clocks may
disagree.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import List, Optional

INTERVAL = 2.0
PREFIX = "fairseq_hybrid/alive/"


def connect(host: str, port: int):
    """A client of torchrun's store (``MASTER_ADDR:MASTER_PORT``)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=30))


class Heartbeat:
    """Advances this rank's counter in ``store`` until the process ends."""

    def __init__(self, store, rank: int):
        self.store, self.rank = store, rank
        self.thread = threading.Thread(target=self._beat, name=f"fairseq-hybrid heartbeat {rank}", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while True:
            try:
                self.store.add(PREFIX + str(self.rank), 1)
            except Exception:  # the store's host is gone: nothing left to tell
                return
            time.sleep(INTERVAL)


def stopped_ranks(store, world_size: int, me: int) -> Optional[List[int]]:
    """The ranks whose counters did not advance over ``2 * INTERVAL``
    seconds; None when the store itself cannot be reached (its node, the
    one of rank 0, has stopped)."""
    def read():
        return [int(store.add(PREFIX + str(rank), 0)) for rank in range(world_size)]

    try:
        before = read()
        time.sleep(2 * INTERVAL + 0.5)
        after = read()
    except Exception:
        return None
    return [rank for rank in range(world_size) if rank != me and after[rank] == before[rank]]
