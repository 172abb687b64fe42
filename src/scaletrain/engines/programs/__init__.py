"""The foreign engines' worker programs (:mod:`scaletrain.engines` states their contract).

Each runs in its engine's own environment and imports only the standard library, NumPy and its framework
(the framework inside functions, so that these modules import anywhere, as the doctests do). They are
started as scripts by scaletrain's launcher, never imported by scaletrain.
"""
