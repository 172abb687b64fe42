"""Predicting speedup before renting a cluster: the Brno thesis's estimator, a refined model, advice
and validation against real runs."""
