"""Triton kernels (one module) and the helpers they share with the Gluon kernels."""
