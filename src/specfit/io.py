"""Atomic outputs: a file or folder appears under its final name only when it is complete.

Snakemake treats any output that exists after a job as finished, so every writer here goes through a
temporary name in the same folder and an ``os.replace``; a killed job leaves only ``.tmp-*`` debris.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; move it onto ``path`` when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if directory and path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def write_json(obj: Any, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


def write_parquet(table: pa.Table, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
