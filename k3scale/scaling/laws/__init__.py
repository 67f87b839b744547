"""Fitted laws and their solvers: Chinchilla surfaces, compute frontiers (envelope, inversion,
parametric law), power laws and IsoFLOP minima, the multi-start objective and the bootstrap."""
