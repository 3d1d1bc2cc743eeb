"""Arithmetic written by hand, below everything that uses it: the fused
output loss (logits never stored), a group's attention-softmax cell as one
autograd node with its backward computed in forward, and packed sequences
of rows sorted by length.  The model (``models/``), the criterion
(``criterions/``) and the engine (``parallel/``) all call these; they
import nothing of the package.
"""
