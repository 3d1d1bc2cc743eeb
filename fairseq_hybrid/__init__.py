"""fairseq_hybrid: hybrid data/model parallel training of LSTM translation models.

Importing the package (``--user-dir fairseq_hybrid`` or ``import
fairseq_hybrid``) registers with fairseq:

* the ``hybrid_lstm`` model and its presets (``hybrid_lstm_tiny``,
  ``hybrid_lstm_base``, ``hybrid_lstm_paper``),
* the ``hybrid_cross_entropy`` criterion,

allowlists the classes that fairseq checkpoints pickle, so that
``torch.load``'s safe ``weights_only`` mode can stay on, lets a
checkpoint from a hybrid group load where its devices are missing, and
makes fairseq's copies of a checkpoint (to ``checkpoint_last.pt``) atomic,
makes fairseq's gradient clipping and ``--fp16`` optimizer correct for
parameters on several devices, refuses fairseq options a group cannot
serve before training starts, keeps ``--patience``'s count in checkpoints,
and, with ``FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1``,
turns on the virtual-device test harness.
"""

__version__ = "0.1.0"

from . import checkpoint_safety  # noqa: E402

checkpoint_safety.install()

from . import checkpoint_portability  # noqa: E402

checkpoint_portability.install()

from . import atomic_checkpoint_copy  # noqa: E402

atomic_checkpoint_copy.install()

from . import multi_device_optim  # noqa: E402

multi_device_optim.install()

from . import patience_state  # noqa: E402

patience_state.install()

from . import trainer_checks  # noqa: E402

trainer_checks.install()

from . import virtual_devices  # noqa: E402

virtual_devices.enable_from_environment()

from . import criterions, models  # noqa: E402,F401
