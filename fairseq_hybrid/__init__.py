"""fairseq_hybrid: hybrid data/model parallel training of LSTM translation models.

Importing the package (``--user-dir fairseq_hybrid`` or ``import
fairseq_hybrid``) registers with fairseq:

* the ``hybrid_lstm`` model and its presets (``hybrid_lstm_tiny``,
  ``hybrid_lstm_base``, ``hybrid_lstm_paper``),
* the ``hybrid_cross_entropy`` criterion,
* the ``ja_mecab`` tokeniser, for validation BLEU on Japanese output
  (``--eval-bleu-detok ja_mecab --eval-tokenized-bleu``),

installs this package's changes to fairseq (:mod:`.fairseq_patches`:
safe checkpoint loading, checkpoints portable across machines, atomic
checkpoint copies, clipping and ``--fp16`` for parameters on several
devices, ``--patience`` kept in checkpoints, options a group cannot serve
refused before training) and, with ``FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1``,
turns on the virtual-device test harness.
"""

__version__ = "0.1.0"

from . import fairseq_patches  # noqa: E402

fairseq_patches.install()

from . import virtual_devices  # noqa: E402

virtual_devices.enable_from_environment()

from . import criterions, ja_mecab_bleu, models  # noqa: E402,F401
