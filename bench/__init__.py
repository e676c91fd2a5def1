"""lowp's benchmarks: `python bench/run.py` runs every section in one process.

A package so that the sections (`bench.linear_step`, `bench.jax_training`, ...) import
each other by name whether run.py is started as a script or imported by a test.
"""
