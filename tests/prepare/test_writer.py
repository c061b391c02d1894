import pytest

from rsgen.prepare.writer import ExternalSorter


@pytest.mark.parametrize("max_buffer_bytes", [150, 1 << 20])  # many runs on disk / all in memory
def test_external_sort_orders_by_key_then_arrival(tmp_path, max_buffer_bytes):
    sorter = ExternalSorter(tmp_path, max_buffer_bytes=max_buffer_bytes)
    keys = [f"F/{(i * 7) % 5:02x}" for i in range(60)]
    for i, key in enumerate(keys):
        sorter.add(key, {"i": i, "text": "ü\n" * (i % 3)})
    assert sorter._buffered < max_buffer_bytes
    if max_buffer_bytes == 150:
        assert len(list(tmp_path.iterdir())) > 10
    out = list(sorter)
    assert [k for k, _ in out] == sorted(keys)
    expected = sorted(range(60), key=lambda i: (keys[i], i))
    assert [r["i"] for _, r in out] == expected
    assert out[0][1]["text"] == ""
