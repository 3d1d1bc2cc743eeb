"""Importing fairseq 0.12 configures the root logger; this undoes it.

``fairseq/models/wav2vec/wav2vec2_classification.py`` calls
``logging.basicConfig(level=logging.DEBUG)`` at import time (and two text
to speech tasks call it again at INFO), and importing fairseq imports every
model and task.  In a program that had not configured logging yet (a
Python user of :mod:`fairseq_hybrid.translation.hub`, a benchmark script)
the root logger is then at DEBUG with a handler on standard error: every
library's debug lines are printed, and the program's own later
``logging.basicConfig(...)`` does nothing, the root logger having a
handler already.  fairseq's command lines are not affected: they configure
logging before they import fairseq, which makes those calls no-ops, and
they load this package afterwards.

:func:`root_logging_kept` wraps the package's first import of fairseq: when
the root logger had no handler before it, the handlers that the import
added are removed and the root logger's level is put back.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


@contextlib.contextmanager
def root_logging_kept() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        if not handlers:
            for handler in [handler for handler in root.handlers if handler not in handlers]:
                root.removeHandler(handler)
            root.setLevel(level)
