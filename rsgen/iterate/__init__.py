"""`rsgen iterate`: rounds of rejection sampling and fine-tuning on what was accepted (STaR / ReST-EM style), a
loop around the pipeline. See rsgen/iterate/loop.py for the flow and the output directory."""

from rsgen.iterate.loop import run_iterate

__all__ = ["run_iterate"]
