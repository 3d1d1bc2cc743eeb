"""fairseq_hybrid: hybrid data/model parallel training of LSTM translation models.

Importing the package (``--user-dir fairseq_hybrid`` or ``import
fairseq_hybrid``) registers with fairseq:

* the ``hybrid_lstm`` model and its presets (``hybrid_lstm_tiny``,
  ``hybrid_lstm_base``, ``hybrid_lstm_paper``),
* the ``hybrid_cross_entropy`` criterion,
* the ``ja_mecab`` tokeniser, for validation BLEU on Japanese output
  (``--eval-bleu-detok ja_mecab --eval-tokenized-bleu``),

and installs this package's changes to fairseq (:mod:`.fairseq_patches`:
safe checkpoint loading, checkpoints portable across machines, atomic
checkpoint copies, clipping and ``--fp16`` for parameters on several
devices, ``--patience`` kept in checkpoints, options a group cannot serve
refused before training).

The verification harness (:mod:`.harness`: virtual devices and streams,
exactness helpers) is no part of the product: it is imported only when
asked for, here by ``FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1``, which runs the
whole process on virtual devices.
"""

import os

__version__ = "0.1.0"

from .fairseq_root_logging import root_logging_kept  # noqa: E402

with root_logging_kept():  # importing fairseq sets the root logger to DEBUG: undone
    from . import fairseq_patches  # noqa: E402

    fairseq_patches.install()

    from . import criterions, models  # noqa: E402,F401
    from .translation import ja_mecab_bleu  # noqa: E402,F401

if os.environ.get("FAIRSEQ_HYBRID_VIRTUAL_DEVICES", "") in ("1", "true", "yes"):
    from .harness import virtual_devices

    virtual_devices.enable_from_environment()
