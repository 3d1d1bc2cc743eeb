"""Which device runs which part of a ``hybrid_lstm`` model.

The hybrid scheme gives every RNN layer a home device (model parallelism:
encoder layer ``l`` and decoder layer ``l`` on device ``l mod K`` by
default, embeddings with the bottom layer, each bridge with its decoder
layer) and splits the attention-softmax part along the batch over all K
devices (data parallelism).  A plan is built and checked once, from the
model options, before any parameter moves, so that a bad option fails with
a message naming it rather than deep inside a forward pass.

``--hybrid-devices``: a comma-separated list (``cuda:0,cuda:1``,
``cpu,cpu``) or a count ``K`` (K CUDA devices where CUDA is available,
otherwise K CPU devices).  ``--hybrid-placement``: empty for the default,
or ``encoder=0,1,0,1;decoder=0,1,0,1`` (indices into the device list, one
per layer; optionally ``;reverse=2`` for the device of each bidirectional
layer's reverse direction, bottom first, and ``;shards=3,0,2,2`` for the
relative sentences of each device's attention-softmax shard), or ``auto`` (:mod:`fairseq_hybrid.planning.placement_search`).
``--hybrid-chunk-length``: time steps per wavefront cell, 0 for K chunks a
sequence, or ``auto`` (:mod:`fairseq_hybrid.planning.chunk_choice`).  Every check of the
``--hybrid-*`` options is here (:func:`check_options`, :func:`build_plan`),
and every failure is a :class:`DevicePlanError` naming the option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

import torch


MODES = ("hybrid", "model", "data")
AUTO = "auto"


class DevicePlanError(ValueError):
    """A ``--hybrid-*`` option that cannot be honoured."""


@dataclass(frozen=True)
class DevicePlan:
    devices: List[torch.device]
    encoder: List[int]  # device index of each encoder layer
    decoder: List[int]  # device index of each decoder layer
    mode: str
    # device index of the reverse direction of each bidirectional layer,
    # bottom first (none given: the device after the layer's)
    reverse: Tuple[int, ...] = ()
    # relative sentences of each device's attention-softmax shard (hybrid
    # mode; none given: equal shards; 0: no shard on that device)
    shard_weights: Tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return len(self.devices)

    def encoder_device(self, layer: int) -> torch.device:
        return self.devices[self.encoder[layer]]

    def decoder_device(self, layer: int) -> torch.device:
        return self.devices[self.decoder[layer]]

    @property
    def shard_workers(self) -> List[int]:
        """Which devices (indices) run the attention-softmax shards: every
        device, except in pure model parallelism, where the whole part runs
        with the top decoder layer."""
        if self.mode == "model":
            return [self.decoder[-1]]
        return [worker for worker in range(self.size) if not self.shard_weights or self.shard_weights[worker] > 0]

    @property
    def shard_devices(self) -> List[torch.device]:
        return [self.devices[worker] for worker in self.shard_workers]

    def reverse_worker(self, layer: int) -> int:
        """The device that runs the reverse direction of the bidirectional
        encoder layer ``layer``: as placed, else the one after the layer's."""
        if layer < len(self.reverse):
            return self.reverse[layer]
        return (self.encoder[layer] + 1) % self.size


def parse_devices(spec: str) -> List[torch.device]:
    """``"cuda:0,cuda:1"``, ``"cpu,cpu"`` or a count; checked against the
    machine."""
    spec = spec.strip()
    if re.fullmatch(r"\d+", spec):
        count = int(spec)
        if count < 1:
            raise DevicePlanError(f"--hybrid-devices {spec}: need at least one device")
        kind = "cuda" if torch.cuda.is_available() else "cpu"
        names = [f"cuda:{i}" for i in range(count)] if kind == "cuda" else ["cpu"] * count
    else:
        names = [name.strip() for name in spec.split(",")]
    devices = []
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise DevicePlanError(f"--hybrid-devices: unknown device {name!r} (expected cpu or cuda:N)") from None
        if device.type not in ("cpu", "cuda"):
            raise DevicePlanError(f"--hybrid-devices: device {name!r} is not supported (expected cpu or cuda:N)")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise DevicePlanError(f"--hybrid-devices asks for {name} but CUDA is not available on this machine")
            if device.index is None:
                device = torch.device("cuda", 0)
            if device.index >= torch.cuda.device_count():
                raise DevicePlanError(
                    f"--hybrid-devices asks for {name} but this machine has {torch.cuda.device_count()} CUDA device(s)"
                )
        devices.append(device)
    if len({device.type for device in devices}) > 1:
        raise DevicePlanError(f"--hybrid-devices {spec}: all devices of a group must be of one kind (cpu or cuda)")
    return devices


def default_placement(encoder_layers: int, decoder_layers: int, num_devices: int):
    """Encoder and decoder layer ``l`` on device ``l mod K``."""
    return ([layer % num_devices for layer in range(encoder_layers)],
            [layer % num_devices for layer in range(decoder_layers)])


def placement_text(encoder: Sequence[int], decoder: Sequence[int], reverse: Sequence[int] = (),
                   shards: Sequence[int] = ()) -> str:
    """A placement as ``--hybrid-placement`` text."""
    text = "encoder=" + ",".join(map(str, encoder)) + ";decoder=" + ",".join(map(str, decoder))
    if reverse:
        text += ";reverse=" + ",".join(map(str, reverse))
    if shards:
        text += ";shards=" + ",".join(map(str, shards))
    return text


def parse_placement(spec: str, encoder_layers: int, decoder_layers: int, num_devices: int):
    """Default or explicit ``(encoder indices, decoder indices, reverse
    indices, shard weights)``; the last two may be empty (their defaults)."""
    if not spec:
        return (*default_placement(encoder_layers, decoder_layers, num_devices), (), ())
    parts = {}
    form = "'encoder=I,I,...;decoder=I,I,...' (optionally ';reverse=I,...;shards=W,...')"
    for part in spec.split(";"):
        name, sep, indices = part.partition("=")
        name = name.strip()
        if not sep or name not in ("encoder", "decoder", "reverse", "shards") or name in parts:
            raise DevicePlanError(f"--hybrid-placement {spec!r}: expected {form}")
        try:
            parts[name] = [int(i) for i in indices.split(",")]
        except ValueError:
            raise DevicePlanError(f"--hybrid-placement {spec!r}: {name} values must be integers") from None
    for name, layers in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        if name not in parts:
            raise DevicePlanError(f"--hybrid-placement {spec!r}: no device given for the {name} layers")
        if len(parts[name]) != layers:
            raise DevicePlanError(
                f"--hybrid-placement: {len(parts[name])} {name} device(s) given for {layers} {name} layers"
            )
    for name in ("encoder", "decoder", "reverse"):
        for index in parts.get(name, []):
            if not 0 <= index < num_devices:
                raise DevicePlanError(
                    f"--hybrid-placement: device index {index} out of range for {num_devices} device(s)"
                )
    if len(parts.get("reverse", [])) > encoder_layers:
        raise DevicePlanError(f"--hybrid-placement: {len(parts['reverse'])} reverse directions for "
                              f"{encoder_layers} encoder layers")
    shards = parts.get("shards", [])
    if shards and (len(shards) != num_devices or min(shards) < 0 or sum(shards) == 0):
        raise DevicePlanError(f"--hybrid-placement: shards= needs one weight >= 0 per device ({num_devices}), "
                              f"not all 0; got {shards}")
    return parts["encoder"], parts["decoder"], tuple(parts.get("reverse", ())), tuple(shards)


def _count_or_auto(value, minimum: int, bad_text: str, bad_value: str) -> Union[int, str]:
    """An option that is a whole number >= ``minimum`` or ``"auto"``: text on
    the command line (so that it can say ``auto``), an int in older
    checkpoints and in the Python API; both are taken.  ``bad_text`` and
    ``bad_value`` are the errors' texts, ``{!r}`` the value given."""
    if isinstance(value, str):
        text = value.strip()
        if text == AUTO:
            return AUTO
        try:
            value = int(text)
        except ValueError:
            raise DevicePlanError(bad_text.format(text)) from None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DevicePlanError(bad_value.format(value))
    return value


def chunk_length_option(value) -> Union[int, str]:
    """``--hybrid-chunk-length`` as a count of time steps >= 0 or ``"auto"``."""
    return _count_or_auto(value, 0, "--hybrid-chunk-length {!r}: give a number of time steps >= 0 (0: one chunk "
                                    "per device) or auto", "--hybrid-chunk-length must be >= 0 or auto, got {!r}")


def micro_batches_option(value) -> Union[int, str]:
    """``--hybrid-micro-batches`` as a count >= 1 or ``"auto"``."""
    bad = "--hybrid-micro-batches must be a whole number >= 1 or auto, got {!r}"
    return _count_or_auto(value, 1, bad, bad)


def softmax_chunks_option(value) -> Union[int, str]:
    """``--hybrid-softmax-chunks`` as a count of time chunks >= 0 or ``"auto"``."""
    bad = "--hybrid-softmax-chunks must be a whole number >= 0 (0: all of a micro-batch's chunks) or auto, got {!r}"
    return _count_or_auto(value, 0, bad, bad)


def check_options(cfg) -> None:
    """The checks of the ``--hybrid-*`` options that need neither the model
    nor the machine; :func:`build_plan` checks the rest."""
    devices = getattr(cfg, "hybrid_devices", "")
    placement = getattr(cfg, "hybrid_placement", "")
    cost_model = getattr(cfg, "hybrid_cost_model", "")
    softmax_chunks = softmax_chunks_option(getattr(cfg, "hybrid_softmax_chunks", 1))
    if not devices:
        if (placement or cost_model or micro_batches_option(getattr(cfg, "hybrid_micro_batches", 1)) != 1
                or softmax_chunks != 1):
            raise DevicePlanError("--hybrid-placement, --hybrid-cost-model, --hybrid-micro-batches and "
                                  "--hybrid-softmax-chunks need --hybrid-devices")
        return
    chunk_length = chunk_length_option(getattr(cfg, "hybrid_chunk_length", 0))
    if (cost_model and placement != AUTO and chunk_length != AUTO and softmax_chunks != AUTO
            and micro_batches_option(getattr(cfg, "hybrid_micro_batches", 1)) != AUTO
            and getattr(cfg, "hybrid_workers", AUTO) != AUTO):
        raise DevicePlanError("--hybrid-cost-model is used by --hybrid-placement auto, --hybrid-chunk-length "
                              "auto, --hybrid-micro-batches auto, --hybrid-softmax-chunks auto and "
                              "--hybrid-workers auto only")
    timeout = getattr(cfg, "hybrid_timeout", 1.0)
    if not timeout > 0:
        raise DevicePlanError(f"--hybrid-timeout must be > 0 seconds, got {timeout}")
    micro_batches = micro_batches_option(getattr(cfg, "hybrid_micro_batches", 1))
    if micro_batches != 1 and getattr(cfg, "hybrid_mode", "hybrid") == "data":
        raise DevicePlanError("--hybrid-micro-batches is for --hybrid-mode hybrid and model (data mode has no "
                              "pipeline to fill)")
    if softmax_chunks != 1 and getattr(cfg, "hybrid_mode", "hybrid") == "data":
        raise DevicePlanError("--hybrid-softmax-chunks is for --hybrid-mode hybrid and model (data mode runs "
                              "the whole model in one cell a device)")


def build_plan(devices: str, placement: str, mode: str, encoder_layers: int, decoder_layers: int) -> DevicePlan:
    if mode not in MODES:
        raise DevicePlanError(f"--hybrid-mode {mode!r}: choose one of {', '.join(MODES)}")
    device_list = parse_devices(devices)
    if mode != "data" and len(device_list) > max(encoder_layers, decoder_layers):
        raise DevicePlanError(
            f"--hybrid-devices: {len(device_list)} devices but the model has only {encoder_layers} encoder and "
            f"{decoder_layers} decoder layers to place; use at most {max(encoder_layers, decoder_layers)} "
            f"(or --hybrid-mode data)"
        )
    if mode == "data":
        if placement:
            raise DevicePlanError("--hybrid-placement has no meaning with --hybrid-mode data (every device holds a replica)")
        encoder, decoder = [0] * encoder_layers, [0] * decoder_layers
        return DevicePlan(device_list, encoder, decoder, mode)
    encoder, decoder, reverse, shards = parse_placement(placement, encoder_layers, decoder_layers, len(device_list))
    if shards and mode == "model":
        raise DevicePlanError("--hybrid-placement shards= is for --hybrid-mode hybrid (in model mode the "
                              "attention-softmax part runs whole with the top decoder layer)")
    return DevicePlan(device_list, encoder, decoder, mode, reverse, shards)


def plan_table(rows: Sequence[Sequence[str]]) -> str:
    """A small aligned text table; ``rows[0]`` is the header."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
