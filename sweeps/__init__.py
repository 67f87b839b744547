"""Search spaces and size ladders shared by the studies in experiments/."""
