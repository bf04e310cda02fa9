"""The worker `bench.memory` runs: `sluicegate worker`, unchanged, plus a memory report.

    python -m bench.memory_worker worker --app bench.memory_apps   # as `sluicegate worker`

On SIGUSR2 the process writes, as JSON to the file `BENCH_MEMORY_REPORT` names (written
whole, then renamed into place), where its memory is:

- RocksDB: per store, its memtables (`rocksdb.cur-size-all-mem-tables`, and with the
  immutable ones not yet freed `size-all-mem-tables`), its table readers' indexes and
  filters, its SST files and its key estimate; and the block cache every store shares;
- Python: the bytes in pymalloc's arenas (objects of 512 bytes or less, and how much of
  those arenas is in use), and the number of blocks Python has allocated;
- malloc (glibc `mallinfo2`): bytes in use, bytes mmapped for large blocks, and bytes
  freed but kept by the allocator (which RSS still counts);
- when the file `<report>.trim` exists (the bench makes it before signalling, and the
  worker removes it), `malloc_trim(0)` is then called, which hands what malloc keeps free
  back to the system, and the process's RSS after it is read (`rss_after_trim`): what of
  the RSS was the allocator's retention rather than anything live.

It finds the Worker from the frame the signal interrupts (the worker's loop runs in the
main thread), so nothing in sluicegate changes for it.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

REPORT_ENV = "BENCH_MEMORY_REPORT"

# The RocksDB properties read from every open store.
_PROPERTIES = (
    "rocksdb.cur-size-all-mem-tables",
    "rocksdb.size-all-mem-tables",
    "rocksdb.num-immutable-mem-table",
    "rocksdb.estimate-table-readers-mem",
    "rocksdb.total-sst-files-size",
    "rocksdb.estimate-num-keys",
    "rocksdb.num-entries-active-mem-table",
)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _malloc() -> dict[str, int]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"in_use": info.uordblks, "mmapped": info.hblkhd, "free_kept": info.fordblks,
            "heap": info.arena}


def _pymalloc() -> dict[str, int]:
    """pymalloc's own summary (sys._debugmallocstats writes it to the C stderr)."""
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found: dict[str, int] = {}
    for name, pattern in (("arenas_bytes", r"arenas \* \d+ bytes/arena\s*=\s*([\d,]+)"),
                          ("allocated_blocks_bytes", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
                          ("free_blocks_bytes", r"# bytes in available blocks\s*=\s*([\d,]+)")):
        match = re.search(pattern, text)
        if match:
            found[name] = int(match.group(1).replace(",", ""))
    return found


def _trim() -> int | None:
    """malloc_trim(0), then this process's VmRSS in bytes."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def _find_worker(frame: FrameType | None) -> Any:
    from sluicegate.engine.runtime import Worker

    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Worker):
            return candidate
        frame = frame.f_back
    return None


def _rocksdb(worker: Any) -> dict[str, Any]:
    from rocksdict import Rdict

    from sluicegate.engine import store as store_module

    stores: dict[str, dict[str, int]] = {}
    tasks = [*worker.tasks.values(), *(t for t in worker._restoring.values() if t is not None)]
    for task in tasks:
        for state in task.stateful():
            db = getattr(state.store, "_db", None)
            if not isinstance(db, Rdict):
                continue  # never written: no RocksDB open
            props: dict[str, int] = {}
            for prop in _PROPERTIES:
                value = db.property_int_value(prop)
                if value is not None:
                    props[prop.removeprefix("rocksdb.")] = int(value)
            stores[f"{state.node.name}/{task.partition}"] = props

    def total(prop: str) -> int:
        return sum(s.get(prop, 0) for s in stores.values())

    cache = store_module._BLOCK_CACHE
    return {
        "stores": stores,
        "memtables": total("size-all-mem-tables"),
        "memtables_active": total("cur-size-all-mem-tables"),
        "table_readers": total("estimate-table-readers-mem"),
        "sst_bytes": total("total-sst-files-size"),
        "keys_estimate": total("estimate-num-keys"),
        "block_cache": cache.get_usage(),
        "block_cache_pinned": cache.get_pinned_usage(),
    }


def _report(_signum: int, frame: FrameType | None) -> None:
    target = os.environ.get(REPORT_ENV)
    if not target:
        return
    out: dict[str, Any] = {"pid": os.getpid()}
    try:
        worker = _find_worker(frame)
        if worker is None:
            out["error"] = "no Worker on the interrupted stack"
        else:
            out["rocksdb"] = _rocksdb(worker)
            out["tasks"] = sorted(worker.tasks)
            out["restoring"] = sorted(worker._restoring)
        out["pymalloc"] = _pymalloc()
        out["python_blocks"] = sys.getallocatedblocks()
        out["malloc"] = _malloc()
        trim = Path(target).with_suffix(".trim")
        if trim.exists():
            trim.unlink()
            out["rss_after_trim"] = _trim()
    except Exception as exc:  # a report that fails must not stop the worker
        out["error"] = f"{type(exc).__name__}: {exc}"
    path = Path(target)
    part = path.with_suffix(".part")
    part.write_text(json.dumps(out, indent=1))
    part.replace(path)


def main() -> None:
    signal.signal(signal.SIGUSR2, _report)
    from sluicegate.ops.cli.root import main as sluicegate_main

    sys.argv[0] = "sluicegate"
    sluicegate_main()


if __name__ == "__main__":
    main()
