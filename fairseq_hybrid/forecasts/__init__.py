"""Forecasts for GPUs: what each way of training a global batch on N GPUs
would give (one GPU, DDP, groups, groups under DDP), priced by the
planner's schedule simulator under a GPU's costs: published cost sets or a
cost file one GPU measured (``cost_file``), plain DDP in the simulator's
terms (``data_parallel_cost``) and the race of them all (``race``), which
``fairseq-hybrid-plan`` prints.  Nothing here runs during training; it uses
the planner (:mod:`fairseq_hybrid.planning`) and the engine's face only.
"""
