"""What a run will do, before anything starts: the matrix of cells (:mod:`.matrix`) and, under a
time budget, how the cells' measurements fit into it (:mod:`.budget`)."""
