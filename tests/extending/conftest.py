"""The made-up plug-ins register themselves when imported: only the tests that use them import them (and put
the registries back), never pytest's collection of doctests, so no other test sees them."""

collect_ignore = ["made_up_codec.py", "made_up_strategy.py", "made_up_technique.py", "made_up_workload.py"]
