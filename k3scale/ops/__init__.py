"""Core numerical ops. Each op folder has `naive.py` (the plain fp32 reference), a fast torch path
where one is needed, and `triton.py` kernels; tests bind every fast path to its reference."""
