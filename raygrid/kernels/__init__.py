"""Compute kernels of the hot paths. Each has a torch reference implementation (``*_ref``) that is the
definition of what the kernel must compute; GPU kernels are tested against it."""
