"""The plug-in registers a workload when imported: only the processes of the runs that name it import it,
never pytest's collection of doctests, so no other test sees it."""

collect_ignore = ["lazy_fashion_plugin.py"]
