"""Load fairseq checkpoints with ``torch.load``'s safe ``weights_only`` mode on.

Since torch 2.6, ``torch.load`` refuses any pickled global that is not a
tensor, a builtin container or explicitly allowlisted, which stops a
malicious checkpoint from running code.  fairseq checkpoints pickle a few
harmless classes (``argparse.Namespace`` for legacy ``args``, omegaconf
containers, numpy scalars in the training state), so fairseq's own loader
fails on them.  Rather than switch safe loading off, we allowlist exactly
those classes, and turn torch's refusal of anything else into an error that
says which checkpoint and which global, without the advice to disable the
check.
"""

from __future__ import annotations

import argparse
import collections
import functools
import pickle
import re
from typing import Callable

import numpy as np


def allowed_globals() -> list:
    """The non-builtin classes a fairseq checkpoint may pickle.

    Checkpoints written by this fairseq store ``cfg`` as plain containers and
    need nothing here; older ones (and other forks) store ``args`` as an
    ``argparse.Namespace`` or ``cfg`` as omegaconf objects, and a best score
    can be a numpy scalar or 0-d array (``--eval-bleu``'s best BLEU is one).  omegaconf's pickles name the builtin types of
    their nodes as globals, hence the builtins.
    """
    import typing

    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    from omegaconf import DictConfig, ListConfig, nodes
    from omegaconf.base import ContainerMetadata, Metadata

    return [
        argparse.Namespace,
        collections.defaultdict,
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
        typing.Any,
        scalar,
        _reconstruct,
        np.ndarray,
        np.dtype,
        type(np.dtype(np.float64)),
        type(np.dtype(np.float32)),
        type(np.dtype(np.int64)),
        dict,
        list,
        tuple,
        int,
        float,
        str,
        bool,
    ]


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint holds a pickled object outside the allowlist."""


_GLOBAL_PATTERN = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _refusal_message(path, err: Exception) -> str:
    match = _GLOBAL_PATTERN.search(str(err))
    what = f"the pickled global {match.group(1)}" if match else "a pickled object"
    return (
        f"refusing to load checkpoint {path}: it contains {what}, which is not one of the "
        f"classes fairseq checkpoints need (fairseq_hybrid.fairseq_patches.checkpoint_safety.allowed_globals). "
        f"Only load checkpoints you trust; if this one is, add that class with "
        f"torch.serialization.add_safe_globals before loading."
    )


def refusing_unsafe(load: Callable) -> Callable:
    """``load`` (fairseq's ``load_checkpoint_to_cpu``) with torch's refusal
    of a pickled global turned into an :class:`UnsafeCheckpointError`."""

    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except pickle.UnpicklingError as err:
            raise UnsafeCheckpointError(_refusal_message(path, err)) from None

    return load_checkpoint_to_cpu
