"""The checkpoint store: atomic parts, first-write-wins reads, and striping that ignores timing."""

import json

from rsgen.store import CheckpointStore, shard_for_rank


def test_parts_are_atomic_and_resumable(tmp_path):
    store = CheckpointStore(tmp_path / "w")
    assert store.done_keys() == set()
    with store.writer(rank=0, every_items=2, every_seconds=1e9) as w:
        for i in range(5):
            w.add({"key": f"k{i}", "v": i})
        assert len(store.parts()) == 2  # flushed at 2 and 4; k4 still buffered
        assert store.done_keys() == {"k0", "k1", "k2", "k3"}
    assert store.done_keys() == {f"k{i}" for i in range(5)}
    assert not list((tmp_path / "w").glob(".*.tmp"))


def test_duplicate_keys_first_wins(tmp_path):
    store = CheckpointStore(tmp_path)
    with store.writer(0) as w:
        w.add({"key": "a", "v": 1})
    with store.writer(1) as w:
        w.add({"key": "a", "v": 2})
    assert store.records() == {"a": {"key": "a", "v": 1}}


def test_leftover_temporary_file_is_ignored(tmp_path):
    (tmp_path / ".123-rank00000-x.tmp").write_text(json.dumps({"key": "half"}) + "\n{broken")
    assert CheckpointStore(tmp_path).done_keys() == set()


def test_striping_covers_every_key_once_for_any_world_size():
    keys = [f"k{i}" for i in range(103)]
    for world in (1, 2, 3, 8):
        got = [k for r in range(world) for k in shard_for_rank(keys, r, world)]
        assert sorted(got) == sorted(keys)


def test_done_keys_reads_keys_without_full_parse_and_matches_records(tmp_path):
    store = CheckpointStore(tmp_path)
    with store.writer(0, every_items=3) as w:
        for i in range(10):
            w.add({"response": "x" * i, "key": f'k"{i}', "id": i})
    line = next(iter(store.parts())).read_text().splitlines()[0]
    assert line.startswith('{"key": ')
    assert store.done_keys() == set(store.records()) == {f'k"{i}' for i in range(10)}
