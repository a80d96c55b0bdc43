"""Process-level tuning and plumbing: allocator (`malloc`), OpenMP threads (`openmp`), matmul
precision (`precision`), console logging (`logging_setup`) and atomic file writes (`atomic`)."""
