"""Measuring how training scales: sweeps over workers, strategies and batch sizes, results, plots, reports."""
