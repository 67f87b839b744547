"""Training: `train(cfg) -> RunResult`, checkpoints, evaluation, throughput, WSD branching.

Importing this package has no side effects; `train` is a function, not a script.
"""

from k3scale.train.loop import RunResult, plan_run, train

__all__ = ["RunResult", "plan_run", "train"]
