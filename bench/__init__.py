"""The benchmarks: one module per question, each printing its figures and the ratios measured side by side in one
run. Run from the checkout's root as ``python -m bench.NAME`` (bench/README.md lists them all); what they share is
in ``bench.harness``."""
