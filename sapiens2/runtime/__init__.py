"""The process: CPUs and threads, the heap, compilation."""
