"""A run whose run.json found no room from its first rewrite on: the reason is said once. The failed
rewrite ("run.json: cannot write …; it still says 'preparing'") is the run's error; the final receipt
failing the same way appended the same clause again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_disk_full import child

pytestmark = pytest.mark.timeout(60)


def test_a_receipt_that_never_found_room_says_so_once(tmp_path: Path) -> None:
    script = r"""
import json, resource, sys
from pathlib import Path
from asyncroll.errors import OutputWriteError
from asyncroll.outputs.rundir import RunDirectory
out = Path(sys.argv[1])
files = RunDirectory(out, {"config": {f"k{i}": [1, 2, 3] for i in range(40)}}, 0.0)
size = (out / "run.json").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
try:
    files.transition("running", 1.0, events_path="x" * size)  # no form of it fits
    first = None
except OutputWriteError as exc:
    first = str(exc)
error = files.finish(None, "failed", 2.0, first)
print(json.dumps({"first": first, "error": error, "receipt": json.loads((out / "run.json").read_text())}))
"""
    report = json.loads(child(script, tmp_path).stdout)
    said = "run.json: cannot write (File too large); it still says 'preparing'"
    assert report["first"] == said
    assert report["error"] is not None and report["error"].count(said) == 1, report["error"]
    assert report["receipt"]["status"] == "preparing"  # whole, if stale
