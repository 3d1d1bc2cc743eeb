"""fairseq_hybrid: hybrid data/model parallel training of LSTM translation models.

Importing the package (``--user-dir fairseq_hybrid`` or ``import
fairseq_hybrid``) registers with fairseq:

* the ``hybrid_lstm`` model and its presets (``hybrid_lstm_tiny``,
  ``hybrid_lstm_base``, ``hybrid_lstm_paper``),
* the ``hybrid_cross_entropy`` criterion,

allowlists the classes that fairseq checkpoints pickle, so that
``torch.load``'s safe ``weights_only`` mode can stay on, lets a
checkpoint from a hybrid group load where its devices are missing, and
makes fairseq's copies of a checkpoint (to ``checkpoint_last.pt``) atomic.
"""

__version__ = "0.1.0"

from . import checkpoint_safety  # noqa: E402

checkpoint_safety.install()

from . import checkpoint_portability  # noqa: E402

checkpoint_portability.install()

from . import atomic_checkpoint_copy  # noqa: E402

atomic_checkpoint_copy.install()

from . import criterions, models  # noqa: E402,F401
