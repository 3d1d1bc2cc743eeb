"""Forecasts for GPUs: what a way of training would give on GPUs, priced
by the planner's schedule simulator under a GPU's costs: published cost
sets and the predicted step (``gpu_costs``), a cost file one GPU
measured (``cost_file``), plain DDP in the simulator's terms
(``data_parallel_cost``), the workload of the user's command
(``workload``) and real batches' lengths (``real_batches``).  The ways
themselves and their race are ``candidates``.  Nothing here runs during
training; it uses the planner, the engine's face and fairseq's batch
sampler.
"""
