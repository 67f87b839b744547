"""The studies' estimators, each evaluated on draws of the cell optima: a cell's fitted
optimum, compute-optimal frontiers and M(C) between arms, and schedule differences."""
