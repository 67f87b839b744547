"""Scaling-law analysis (issue 7): from run tables to the fit artifact a report prints.

NumPy, SciPy and polars only: never imports torch or Ray. The folders follow the dependency
direction; each imports only those listed before it (issue 32):

- `values/`: what a reported number is. `checks` (input checks), `verdict` (identified or not,
  and why), `uncertainty` (the one percentile interval; `Estimate` = value, interval, verdict),
  `result` (`FitResult`, deterministic JSON), `fitdoc` (the fit artifact's schema: the records
  the estimators write and the report, dashboards and bench read back).
- `inputs/`: where runs come from. `tables` (run and curve tables), `sources` (MLflow bulk reads,
  replicas), `simulate` (synthetic studies with a known truth).
- `laws/`: fitted laws and their solvers. `objective` (log-space power laws, multi-start
  L-BFGS-B), `bootstrap`, `surface` (Chinchilla L(N, D): Epoch's protocol for any table, the
  grid fit over draws for the studies), `frontier` (the lower envelope, the M(C) inversion and
  the law L(C)), `frontier_compare` (fitted frontiers of groups, shared-exponent test),
  `powerlaw` (HP laws, N_opt(C)), `isoflop` (Approach 2).
- `estimates/`: the studies' estimators, each evaluated on draws of the cell optima.
  `optimum` (a cell's fitted optimum, pooled run noise), `compute_optimal` (frontiers by two
  routes and M(C) between arms), `schedule_compare` (differences per cell and pooled).
- on top: `study` (the blocks analysis/*.py recipes use), `batch_check` (issue 20), `generic`
  (`k3scale fit surface|frontier CSV`), `headline` (the report's text and tables), `artifact`
  (fit JSON with provenance; recipes), `reproduce` (the rule a refit is held to).
"""
