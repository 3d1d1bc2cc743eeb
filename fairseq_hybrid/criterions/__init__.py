from .hybrid_cross_entropy import HybridCrossEntropyCriterion  # noqa: F401
