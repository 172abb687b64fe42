"""Worker scripts that the tests start as processes of a run (with the torchrun variables, or through
``tests.helpers.run_job``): each trains what its test compares and prints or writes what the test reads.
Nothing here is a test; the tests that start them say which they start."""
