"""The verification and measurement harness, shipped apart from the product
(as ``torch.testing._internal`` is apart from torch): virtual devices, their
streams and memory; PyTorch's CUDA Sanitizer on the engine's workers; the
exactness helpers; stand-in dictionaries, models and batches; and what the
measurement scripts share.

No product module imports it.  It is loaded only when asked for: by
``FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1``, by a test, by a script under
``benchmarks/``.
"""
