"""Patches the training worker applies to PyTorch before it builds a model.

- ``conv2d``: a Conv2d that computes through matrix products, for GPUs whose MIOpen has no kernel
  database (imports torch).
- ``batchnorm``: batch norm through ATen's own kernels, for GPUs where MIOpen's batch norm fails or has no
  kernel database (imports torch).
- ``miopen_db``: which architecture the ROCm runtime reports and whether MIOpen has kernels for it
  (no torch: the supervisor's doctor uses it too).

Importing this package imports neither torch nor any patch.
"""
