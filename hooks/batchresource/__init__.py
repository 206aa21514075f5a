"""The batch-resource built-in hook: Koordinator's BE-pod batch-cpu / batch-memory
translated into container and pod cgroup values (see docs/hook-batchresource.md)."""
