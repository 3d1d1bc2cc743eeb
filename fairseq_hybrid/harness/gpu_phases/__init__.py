"""The GPU check's phases, one study a module (``benchmarks/gpu_check.py``
runs each as ``benchmarks/gpu_phases.py NAME`` in a process of its own);
what they share is :mod:`.base`.  What each measures: docs/gpu.md."""
