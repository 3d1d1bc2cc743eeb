"""What the trainer and its stages say to each other (the step's batch,
the loss sums, their gradients), pickled with host tensors as their dtype,
shape and bytes: torch's own pickling of a tensor goes through
``torch.serialization`` (a storage, a legacy record), which cost the
trainer about 2 ms a step in the host-bound regime
(docs/bench/profile_workers_host_bound.md), for tensors of a few hundred
bytes.  Anything else (a tensor that needs a gradient, one on a GPU) is
pickled as torch pickles it; the reader is plain ``pickle.loads``."""

from __future__ import annotations

import io
import pickle

import torch


def rebuilt(dtype: str, shape, data: bytes) -> torch.Tensor:
    """The tensor :func:`dumps` wrote."""
    kind = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(data), dtype=kind).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if (type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.device.index is None
                and obj.layout == torch.strided and not obj.requires_grad):
            flat = obj.detach().contiguous().reshape(-1)
            return rebuilt, (str(obj.dtype).removeprefix("torch."), tuple(obj.shape),
                             flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        return NotImplemented


def dumps(obj) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()
