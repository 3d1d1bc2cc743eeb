"""Loading a checkpoint written by a hybrid group where its devices are
missing.

A checkpoint records the ``--hybrid-devices`` of the run that wrote it, and
``fairseq-generate`` / ``fairseq-interactive`` build the model from that
record.  Parameters are saved in one device-independent layout, so the only
thing that ties a checkpoint to its machine is that record: where the
recorded devices do not exist (a 4-GPU checkpoint on a laptop), the model is
built on one device instead, with a warning.  ``--model-overrides
"{'hybrid_devices': 'cuda:0,cuda:1'}"`` places it on a group of this
machine.  A recorded ``--hybrid-cost-model`` file that is not here is
dropped the same way (``--hybrid-placement auto`` and ``--hybrid-chunk-length
auto`` then use their default cost model; placement and chunk length change
speed, never results).  Resuming training is unaffected:
fairseq-train builds the model from its own command line.
"""

import logging
import os

from ..parallel import DevicePlanError, parse_devices

logger = logging.getLogger(__name__)


def make_portable(state: dict) -> dict:
    """Drop a recorded device list this machine cannot honour."""
    cfg = state.get("cfg") if isinstance(state, dict) else None
    model_cfg = cfg.get("model") if cfg is not None else None
    devices = getattr(model_cfg, "hybrid_devices", None) if model_cfg is not None else None
    if not devices:
        return state
    cost_model = getattr(model_cfg, "hybrid_cost_model", "")
    if cost_model and not os.path.exists(cost_model):
        logger.warning("checkpoint's --hybrid-cost-model %s is not on this machine; --hybrid-placement auto and "
                       "--hybrid-chunk-length auto use their default cost model instead", cost_model)
        model_cfg.hybrid_cost_model = ""
    try:
        parse_devices(devices)
    except DevicePlanError as err:
        logger.warning("checkpoint was trained on --hybrid-devices %s, which this machine cannot place (%s); "
                       "loading it on one device", devices, err)
        model_cfg.hybrid_devices = ""
        model_cfg.hybrid_placement = ""
        model_cfg.hybrid_cost_model = ""
    return state
