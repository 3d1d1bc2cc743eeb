"""Forecasts for GPUs: what each way of training a global batch on N GPUs
would give (one GPU, DDP, groups, groups under DDP), priced by the
planner's schedule simulator under a GPU's costs: published cost sets or a
cost file one GPU measured (``cost_file``), plain DDP in the simulator's
terms (``data_parallel_cost``) and the race of them all (``race``), for
the workload of the user's command (``workload``), as the rows
``fairseq-hybrid-plan`` prints (``plan_prices``).  Nothing here runs
during training; it uses the planner, the engine's face and fairseq's
batch sampler as ``timing`` draws it.
"""
