"""Numeric kernels the task pipelines share, apart from what a task is: exact resizes, blurs and
normalisations written for speed at photo size (no model, no files, no task names)."""
