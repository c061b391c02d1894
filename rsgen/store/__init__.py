"""Where a stage's work lives and how it is done: the checkpoint store (`checkpoint`: atomic per-rank parts, what is
done) and the keyed-work loop (`keyed_work`: what to hand out, to which rank, resumably)."""

from rsgen.store.checkpoint import PART_SUFFIX, QUARANTINE, CheckpointStore, PartWriter, part_damage
from rsgen.store.keyed_work import (
    KeyedStage,
    KeyedWorkSummary,
    distributed_state,
    read_server_counts,
    run_keyed_work,
    shard_for_rank,
)

__all__ = [
    "PART_SUFFIX",
    "QUARANTINE",
    "CheckpointStore",
    "KeyedStage",
    "KeyedWorkSummary",
    "PartWriter",
    "distributed_state",
    "part_damage",
    "read_server_counts",
    "run_keyed_work",
    "shard_for_rank",
]
