"""Real timing: fairseq-style training steps timed on a command's batches
(``training_steps``), one DDP rank's timed steps (``ddp_rank``), the cost
model of CPU devices measured on the spot (``cpu_calibration``), what a GPU
cost file holds measured on the user's model (``gpu_calibration``), and
``fairseq-hybrid-plan --measure``, which runs every candidate way of
training in a process of its own (``plan_measure``, ``plan_candidate``).
The planner's simulator and the GPU forecasts price; this measures.
"""
