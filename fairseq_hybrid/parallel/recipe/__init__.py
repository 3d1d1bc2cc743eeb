"""How a hybrid step is cut into cells: which device runs which layer, where
every row and time step goes, the batch staged once, the cells of a
``hybrid``, ``model`` or ``data`` step and the single-device dropout masks."""
