"""A process per device (``--hybrid-workers processes``): the stage that
runs one device's cells, the trainer's side that starts and watches the
stages, their messages, and the wires between stages (pipes on host
memory, torch.distributed between GPUs).  Runs cells through the same
runtime as threads; is handed its step's builder, never imports it."""
