"""Where runs come from: the run and curve tables, MLflow and replica reads, and synthetic
studies with a known truth laid out like a preset."""
