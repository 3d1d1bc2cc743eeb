"""The candidates: every way to train one global batch on N devices (one
device, DDP, one hybrid group with worker threads or a process per
device, groups under DDP), each an object that prices itself, runs itself
and says its command line (``ways``), a group's best choices under a cost
model (``group_search``), the race of them all (``race``), as the rows
``fairseq-hybrid-plan`` prints (``plan_prices``), measured side by side by
its ``--measure`` (``measure``), each run in a process of its own
(``run_one``).  Prices come from the planner's simulator and the GPU
forecasts; runs from ``timing``.
"""
