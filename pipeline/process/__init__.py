"""Process-level tuning and plumbing: allocator (`malloc`), OpenMP threads (`openmp`), matmul
precision (`precision`), console logging (`logging_setup`), atomic file writes (`atomic`) and
SIGTERM as Ctrl-C (`stop_signals`)."""
