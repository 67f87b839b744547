"""Scaling-law analysis (issue 7). NumPy/SciPy/polars only: never imports torch or Ray.

Modules, in data-flow order:
- `tables` (run/curve tables, `load_tables`, `table_hash`), `sources` (MLflow bulk reads, replicas);
- `objective` (log-space power laws, Huber, multi-start L-BFGS-B), `bootstrap` (seeded, parallel);
- fits: `surface` (Chinchilla Approach 3, Epoch's protocol, VPNLS), `frontier` (L(C)),
  `isoflop` (Approach 2), `powerlaw` (N_opt(C), HP laws), `optimum` (a cell's fitted optimum
  with draws of its sampling distribution, pooled run noise);
- comparisons: `compute_optimal` (frontiers from compute-optimal points by two routes, M(C)),
  `multiplier` + `frontier_compare` (parametric L(C), shared-exponent test), `schedule_compare`
  (per cell and pooled); `verdict` (identified or not, and why) on every headline quantity;
- `simulate` (synthetic studies with a known truth, for `k3scale bench calibrate`);
- `study` (table-level blocks used by `analysis/*.py` recipes), `artifact` (fit JSON, provenance),
  `generic` (`k3scale fit surface|frontier CSV`), `result` (`FitResult`, deterministic JSON).
"""
