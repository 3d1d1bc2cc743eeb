"""Real timing: fairseq-style training steps timed on a command's batches
(``training_steps``), the user's command made into a model and batches
(``command_model``), one DDP rank's timed steps (``ddp_rank``), the cost
model of CPU devices measured on the spot (``cpu_calibration``), what a
process per device costs beyond its cells (``worker_costs``), what a GPU
cost file holds measured on the user's model (``gpu_calibration``), and
the calibrations ``fairseq-hybrid-plan`` runs in a process of their own
(``calibration_runs``).  The planner's simulator and the GPU forecasts
price; this measures.
"""
