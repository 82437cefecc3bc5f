"""Mutational fuzzing of model files in CI: 1,000 mutated copies of the tiny
model in every recipe and in a split set (benchmarks/fuzz_files.py), each run
as `goosedump run FILE -p hi -n 2` in watched worker processes: every case
runs or fails with one line naming the file; no traceback, signal or hang.
The seeds are fixed, so the cases that once found defects (a block_count of
2^32 - 1 looping for ever, a vocabulary missing a byte or a special token,
control characters in a metadata key) are replayed every time."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "fuzz_files.py")


def test_a_thousand_mutated_files_per_recipe_end_cleanly(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--cases", "1000", "--workers", "2", "--seed", "0",
                          "--keep", str(tmp_path / "failing")], capture_output=True, text=True, timeout=1200)
    print(out.stdout[-3000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and not result["failures"], result["failures"][:10]
    totals = result["totals"]
    assert len(totals) >= 14 and all(sum(c.values()) == 1000 for c in totals.values())
    for recipe, counts in totals.items():
        assert set(counts) <= {"ran", "clean error"}, (recipe, counts)
        assert counts.get("ran", 0) > 50 and counts.get("clean error", 0) > 500, (recipe, counts)
