"""The made-up plug-ins register themselves when imported: only the tests that use them import them (and put
the registries back), never pytest's collection of doctests, so no other test sees them. The example plug-in
package is installed by its test into a folder of its own."""

collect_ignore = [
    "made_up_codec.py",
    "made_up_strategy.py",
    "made_up_technique.py",
    "made_up_workload.py",
    "example_plugin",  # a package of its own, installed by test_installed_workload.py, not a module of the tests
]
