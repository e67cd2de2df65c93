"""Parallelism: the rank grid, process groups, and tensor-parallel layers."""
