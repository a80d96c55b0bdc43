"""Where a run meets devices and Ray: device and backend choice, the Ray runtime a run shares
between its engine and its trainer workers."""
