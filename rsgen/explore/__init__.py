"""The explore stage: sampled responses beyond the greedy one, until each question has a verified-correct and a
verified-wrong response (`explore_stop: paired`) or `explore_samples` are drawn (`never`)."""

from rsgen.explore.stage import run_explore

__all__ = ["run_explore"]
