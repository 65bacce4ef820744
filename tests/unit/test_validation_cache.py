"""The validation cache is JSON checked against its keys: a planted file can never run code, and
anything that is not a result for these very keys is ignored (validation runs again)."""

from __future__ import annotations

import json
import pickle

from validation import cache

REPORT = {"success": True, "n_expectations": 7, "n_failed": 0, "failures": [], "duration_s": 0.5}


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return eval, (f"open({self.marker!r}, 'w').write('x')",)


def test_a_result_round_trips_for_its_own_keys_only(tmp_path):
    path = cache.cache_file(tmp_path, "d" * 64, "s" * 64)
    assert path.name == f"{'d' * 16}-{'s' * 16}.json"
    assert cache.read(path, "d" * 64, "s" * 64) is None  # nothing cached yet
    cache.write(path, "d" * 64, "s" * 64, REPORT)
    assert cache.read(path, "d" * 64, "s" * 64) == REPORT
    assert cache.read(path, "e" * 64, "s" * 64) is None  # other data, same file name prefix
    assert cache.read(path, "d" * 64, "t" * 64) is None
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_a_planted_pickle_is_never_unpickled(tmp_path, caplog):
    path = cache.cache_file(tmp_path, "d" * 64, "s" * 64)
    path.write_bytes(pickle.dumps(_Payload(tmp_path / "ran")))
    assert cache.read(path, "d" * 64, "s" * 64) is None
    assert not (tmp_path / "ran").exists()
    assert "validating again" in caplog.text and str(path) in caplog.text


def test_a_record_that_is_not_a_whole_result_is_ignored(tmp_path):
    path = cache.cache_file(tmp_path, "d" * 64, "s" * 64)
    keys = {"format": cache.FORMAT, "data_key": "d" * 64, "suite_key": "s" * 64}
    for bad in ({**keys, "report": {**REPORT, "success": "yes"}}, {**keys, "report": {**REPORT, "n_failed": True}},
                {**keys, "report": {k: v for k, v in REPORT.items() if k != "failures"}},
                {**keys, "format": 0, "report": REPORT}, {"__class__": "os.system", "data": "true"}, [REPORT]):
        path.write_text(json.dumps(bad))
        assert cache.read(path, "d" * 64, "s" * 64) is None, bad
