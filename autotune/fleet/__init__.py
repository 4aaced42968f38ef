"""Planning a fleet: which GPU, how many replicas, at what cost, for a workload at a
target load and SLOs, and the files that deploy it (`autotune plan`)."""
