"""The checkpoint store: atomic parts, first-write-wins reads, damaged parts set aside, disk full and SIGTERM,
and striping that ignores timing; the keyed-work
loop generate and judge share (driven here by a scripted engine and stage: this is about the loop's control flow;
both stages run it end to end with real tiny models in tests/generate and tests/judge)."""

import errno
import json
import os
import signal
from dataclasses import dataclass, field

import pytest

from rsgen.interrupt import Interrupted, interruptible
from rsgen.store import CheckpointStore, run_keyed_work, shard_for_rank
from rsgen.store.checkpoint import COMPACT_FAN_IN


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


def test_a_part_line_is_the_key_then_the_other_fields_sorted_whatever_their_order(tmp_path):
    records = [{"v": 1, "key": "k\u00e9", "a": {"z": 1, "b": [None, 1.5]}}, {"key": "k2", "a": "x", "v": 2},
               {"a": "\"\n", "key": "k3", "v": 3}, {"key": "k4"}, {"v": 5, "key": "k5", "a": None, "b": True}]
    with CheckpointStore(tmp_path).writer(0, every_items=100) as w:
        for rec in records:
            w.add(rec)
    (part,) = CheckpointStore(tmp_path).parts()
    expected = "".join(json.dumps({"key": r["key"], **{k: r[k] for k in sorted(r) if k != "key"}}, ensure_ascii=False)
                       + "\n" for r in records)
    assert part.read_bytes() == expected.encode("utf-8")


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


@dataclass
class FakeState:
    """One rank of a simulated world (the parts of accelerate's PartialState the loop uses)."""

    process_index: int = 0
    num_processes: int = 1
    barriers: int = 0

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def wait_for_everyone(self) -> None:
        self.barriers += 1


@dataclass
class Request:
    key: str
    meta: int


class EchoEngine:
    """Scripted engine: answers each request with its key reversed."""

    def __init__(self):
        self.seen: list[str] = []

    def generate(self, requests):
        for request in requests:
            self.seen.append(request.key)
            yield request, request.key[::-1]


@dataclass
class ScriptedStage:
    name: str = "scripted"
    unit: str = "item"
    all_keys: list[str] = field(default_factory=lambda: [f"k{i:02d}" for i in range(10)])

    def keys(self):
        return list(self.all_keys)

    def requests(self, pending):
        return (Request(key, int(key[1:])) for key in pending)

    def record(self, request, result):
        return {"key": request.key, "n": request.meta, "answer": result}

    def progress(self, record):
        return {"last": record["n"]}


def test_keyed_work_stripes_ranks_and_skips_done_keys(tmp_path):
    store = CheckpointStore(tmp_path)
    engines = []

    def make_engine():
        engines.append(EchoEngine())
        return engines[-1]

    stage = ScriptedStage()
    # Rank 1 of 3 runs first: its stripe only.
    summary = run_keyed_work(stage, store, FakeState(1, 3), make_engine)
    assert engines[0].seen == ["k01", "k04", "k07"] and summary.done_now == 3 and summary.total == 10
    # A restart on 2 ranks: rank 0 owns k00, k02, ... and skips k04 (done by the old rank 1).
    state = FakeState(0, 2)
    summary = run_keyed_work(stage, store, state, make_engine)
    assert engines[1].seen == ["k00", "k02", "k06", "k08"] and summary.already_done == 1 and state.barriers == 1
    assert store.records()["k04"] == {"key": "k04", "n": 4, "answer": "40k"}


def test_keyed_work_keeps_a_group_on_one_rank(tmp_path):
    """A stage with `group(key)` (explore: the samples of one question share a prompt) stripes whole groups."""

    @dataclass
    class GroupedStage(ScriptedStage):
        all_keys: list[str] = field(default_factory=lambda: [f"q{q}#{s}" for q in range(5) for s in (1, 2, 3)])

        def requests(self, pending):
            return (Request(key, 0) for key in pending)

        @staticmethod
        def group(key):
            return key.split("#")[0]

    stage = GroupedStage()
    seen = {}
    for rank in (0, 1):
        engine = EchoEngine()
        run_keyed_work(stage, CheckpointStore(tmp_path / f"rank{rank}"), FakeState(rank, 2), lambda engine=engine: engine)
        seen[rank] = engine.seen
    assert seen[0] == [f"q{q}#{s}" for q in (0, 2, 4) for s in (1, 2, 3)]
    assert seen[1] == [f"q{q}#{s}" for q in (1, 3) for s in (1, 2, 3)]


def test_keyed_work_builds_no_engine_when_nothing_is_pending(tmp_path):
    store = CheckpointStore(tmp_path)
    run_keyed_work(ScriptedStage(), store, FakeState(), EchoEngine)
    summary = run_keyed_work(ScriptedStage(), store, FakeState(), lambda: pytest.fail("engine built"))
    assert summary.engine is None and summary.done_now == 0 and summary.already_done == 10


def test_keyed_work_keeps_finished_records_when_the_engine_fails(tmp_path):
    class FailingEngine(EchoEngine):
        def generate(self, requests):
            for n, pair in enumerate(super().generate(requests)):
                if n == 3:
                    raise RuntimeError("device lost")
                yield pair

    store = CheckpointStore(tmp_path)
    with pytest.raises(RuntimeError, match="device lost"):
        run_keyed_work(ScriptedStage(), store, FakeState(), FailingEngine, every_items=100)
    assert store.done_keys() == {"k00", "k01", "k02"}  # flushed on the way out


def write_parts(store, n_parts=3, per_part=2):
    with store.writer(0, every_items=per_part) as w:
        for i in range(n_parts * per_part):
            w.add({"key": f"k{i}", "response": "x" * 50})
    return store.parts()


@pytest.mark.parametrize("damage", ["cut_in_half", "flipped_byte", "emptied"])
def test_a_damaged_part_is_quarantined_and_its_keys_are_redone(tmp_path, damage, caplog):
    store = CheckpointStore(tmp_path / "generate")
    parts = write_parts(store)
    bad = parts[1]
    data = bad.read_bytes()
    if damage == "cut_in_half":
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "flipped_byte":  # still valid JSON: only the checksum tells
        bad.write_bytes(data.replace(b"xxx", b"xyx", 1))
    else:
        bad.write_bytes(b"")
    with caplog.at_level("WARNING"):
        assert store.done_keys() == {"k0", "k1", "k4", "k5"}
    assert str(bad) in caplog.text and "quarantine" in caplog.text
    assert store.parts() == [parts[0], parts[2]]
    assert (tmp_path / "generate" / "quarantine" / bad.name).exists()
    assert set(store.records()) == {"k0", "k1", "k4", "k5"}


def test_iter_records_also_sets_damaged_parts_aside(tmp_path):
    store = CheckpointStore(tmp_path)
    parts = write_parts(store)
    parts[0].write_bytes(parts[0].read_bytes()[:-7])
    assert [r["key"] for r in store.iter_records()] == ["k2", "k3", "k4", "k5"]
    assert len(store.parts()) == 2


def test_a_part_without_checksum_must_parse(tmp_path):
    """Parts named without a CRC (older versions) are checked line by line."""
    (tmp_path / "00000000000000000001-rank00000-aaaaaaaa.jsonl").write_text('{"key": "a", "v": 1}\n')
    (tmp_path / "00000000000000000002-rank00000-bbbbbbbb.jsonl").write_text('{"key": "b", "v": 1}\n{"key": "c", "v"\n')
    store = CheckpointStore(tmp_path)
    assert store.done_keys() == {"a"}
    assert [p.name for p in (tmp_path / "quarantine").iterdir()] == ["00000000000000000002-rank00000-bbbbbbbb.jsonl"]


def test_parts_and_their_directory_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = CheckpointStore(tmp_path / "w")
    with store.writer(0) as w:
        synced.clear()
        w.add({"key": "a"})
    (part,) = store.parts()
    assert synced[0].startswith(str(tmp_path / "w" / ".")) and synced[0].endswith(".tmp")  # the data, then
    assert synced[1] == str(tmp_path / "w")  # the rename


def test_disk_full_during_a_part_write_leaves_no_file(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    store = CheckpointStore(tmp_path)
    writer = store.writer(0, every_items=100)
    writer.add({"key": "a"})
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as err:
        writer.flush()
    assert err.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # neither a part nor its temporary file
    monkeypatch.undo()
    writer.flush()  # the records are still buffered: once there is room, they are written
    assert store.done_keys() == {"a"}


class SignallingEngine(EchoEngine):
    """Scripted engine that receives SIGTERM (as from Slurm) after `after` results."""

    def __init__(self, after):
        super().__init__()
        self.after = after

    def generate(self, requests):
        for n, pair in enumerate(super().generate(requests)):
            if n == self.after:
                os.kill(os.getpid(), signal.SIGTERM)
            yield pair


def test_sigterm_flushes_every_buffered_record(tmp_path):
    store = CheckpointStore(tmp_path)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted):
        run_keyed_work(ScriptedStage(), store, FakeState(), lambda: SignallingEngine(4), every_items=10**9,
                       every_seconds=1e9)
    assert store.done_keys() == {"k00", "k01", "k02", "k03"}  # nothing flushed on its own: all on the way out
    assert signal.getsignal(signal.SIGTERM) is previous
    # The rerun does the rest only.
    engine = EchoEngine()
    run_keyed_work(ScriptedStage(), store, FakeState(), lambda: engine)
    assert engine.seen == [f"k{i:02d}" for i in range(4, 10)] and len(store.done_keys()) == 10


def test_a_signal_during_a_part_write_waits_for_the_part(tmp_path, monkeypatch):
    real_replace = os.replace

    def replace_after_signal(src, dst):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives between writing the data and the rename
        real_replace(src, dst)

    store = CheckpointStore(tmp_path)
    writer = store.writer(0, every_items=100)
    writer.extend({"key": f"k{i}"} for i in range(3))
    monkeypatch.setattr(os, "replace", replace_after_signal)
    with interruptible(), pytest.raises(Interrupted):
        writer.flush()
    assert store.done_keys() == {"k0", "k1", "k2"} and writer.buffer == []


def test_a_writer_merges_its_parts_so_that_they_stay_few(tmp_path):
    """Flushed after every record, 2,000 records would be 2,000 parts; merged 16 at a time they are a few dozen,
    every record read once, in write order."""
    store = CheckpointStore(tmp_path)
    with store.writer(0, every_items=1, every_seconds=1e9) as w:
        for i in range(2000):
            w.add({"key": f"k{i:04d}", "v": i})
            if i == 999:  # mid-way, a reader sees every record written so far
                assert store.done_keys() == {f"k{j:04d}" for j in range(1000)}
    assert len(store.parts()) <= 4 * (COMPACT_FAN_IN - 1)
    assert [r["key"] for r in store.iter_records()] == [f"k{i:04d}" for i in range(2000)]
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_merge_cut_short_leaves_records_twice_and_they_are_read_once(tmp_path, monkeypatch):
    """A kill after the merged part is on disk and before its sources are removed: nothing is lost."""
    from pathlib import Path

    def killed(self, missing_ok=False):
        raise KeyboardInterrupt  # stands for the kill: the merged part was published, no source removed yet

    store = CheckpointStore(tmp_path)
    writer = store.writer(0, every_items=1, every_seconds=1e9)
    monkeypatch.setattr(Path, "unlink", killed)
    with pytest.raises(KeyboardInterrupt):
        for i in range(COMPACT_FAN_IN):
            writer.add({"key": f"k{i:02d}"})
    monkeypatch.undo()
    assert len(store.parts()) == COMPACT_FAN_IN + 1  # the sources and the merged part
    assert [r["key"] for r in store.iter_records()] == [f"k{i:02d}" for i in range(COMPACT_FAN_IN)]
    assert store.done_keys() == {f"k{i:02d}" for i in range(COMPACT_FAN_IN)}


def test_a_damaged_part_is_never_merged_and_still_goes_to_quarantine(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    writer = store.writer(0, every_items=1, every_seconds=1e9)
    for i in range(COMPACT_FAN_IN - 1):
        writer.add({"key": f"k{i:02d}", "response": "x" * 20})
    bad = store.parts()[3]
    bad.write_bytes(bad.read_bytes().replace(b"xxx", b"xyx", 1))  # still JSON: only the CRC tells
    writer.add({"key": "last", "response": "x"})  # the merge
    assert bad.exists() and len(store.parts()) == 2  # the merged part, and the damaged one left out of it
    with caplog.at_level("WARNING"):
        assert store.done_keys() == {f"k{i:02d}" for i in range(COMPACT_FAN_IN - 1)} - {"k03"} | {"last"}
    assert (tmp_path / "quarantine" / bad.name).exists() and "quarantine" in caplog.text
