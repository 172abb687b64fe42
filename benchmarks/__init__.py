"""Benchmarks: scripts that measure scaletrain side by side in one run and print the ratios (docs/benchmarks.md).
Each runs as ``python benchmarks/NAME.py``; they sit above the package's layers and nothing in it imports them."""
