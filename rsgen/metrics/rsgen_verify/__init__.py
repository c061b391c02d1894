"""The `evaluate` module `rsgen_verify.py` and its metric card; a package only so that wheels ship both.

Load it with `evaluate.load(rsgen.metrics.metric_path(), "<verifier name>")`, not by importing this package.
"""
