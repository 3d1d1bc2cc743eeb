"""How any worker runs any cells: the wavefront order, one cell graph with
the channel to the other workers injected, worker threads and the state
they carry, moving tensors in stream order, replicas, seeded dropout.
Knows nothing of how a hybrid step is cut (``recipe/``)."""
