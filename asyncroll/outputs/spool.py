"""Records appended once and read back in order, any number of times, from an anonymous temporary file:
what lets an export handle a run of any size in bounded memory (SPEC §3).

Records (plain tuples) are pickled in batches of ``batch`` and written at the end of the file; reading
unpickles one batch at a time. The file is unlinked as soon as it is made, so nothing is left behind even
if the process is killed; its descriptor closes when the spool is closed or collected. Pickle is safe
here: a spool only ever reads back what it wrote itself.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from asyncroll.outputs.lines import write_all


class Spool:
    """``dir``: where the temporary file goes (None: the system's temporary directory)."""

    def __init__(self, dir: Path | None = None, batch: int = 2048) -> None:
        self.dir, self.batch = dir, batch
        self._fd: int | None = None
        self._closer: weakref.finalize[Any, Any] | None = None
        self._chunks: list[tuple[int, int]] = []  # (offset, size) of each pickled batch
        self._size = 0
        self._pending: list[Any] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, record: Any) -> None:
        self._pending.append(record)
        self._count += 1
        if len(self._pending) >= self.batch:
            self._flush()

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.append(record)

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._fd is None:
            self._fd, name = tempfile.mkstemp(dir=self.dir, prefix=".asyncroll-export-")
            os.unlink(name)
            self._closer = weakref.finalize(self, os.close, self._fd)  # when closed or collected
        data = pickle.dumps(self._pending, protocol=pickle.HIGHEST_PROTOCOL)
        write_all(self._fd, data, self._size)  # a short write (a full disk) raises, never half a batch
        self._chunks.append((self._size, len(data)))
        self._size += len(data)
        self._pending = []

    def __iter__(self) -> Iterator[Any]:
        self._flush()  # later appends go to new batches: a reader sees what was there when it began
        chunks, fd = list(self._chunks), self._fd
        for offset, size in chunks:
            assert fd is not None
            yield from pickle.loads(os.pread(fd, size, offset))

    def close(self) -> None:
        """Delete the file now (otherwise: when the spool is collected); the spool is empty afterwards."""
        if self._closer is not None:
            self._closer()
        self._fd, self._closer, self._chunks, self._pending, self._count = None, None, [], [], 0
