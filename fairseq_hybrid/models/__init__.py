from .hybrid_lstm import HybridLSTMModel  # noqa: F401
