"""OSU-style tables on stdout, and every row with the run's metadata as JSON or CSV.

JSON (``--json FILE``), schema ``pycomm-bench/1``::

    {"schema": "pycomm-bench/1", "benchmark": "osu_allreduce", "title": "...",
     "library": "pycomm 0.1.0, transport shm",
     "meta": {"benchmark", "library", "library_version", "world_size", "transport",
              "algorithm", "dtype", "host", "cpu_count", "pycomm_version", "date",
              "loadavg", ...benchmark-specific keys},
     "machine": {host, nproc, cpu_model, kernel, python, numpy, date, loadavg[3]},
     "columns": [names of the row keys, in order],
     "rows": [{"size": 8, "avg_us": 3.1, ...}, ...]}

A row may carry its own ``algorithm`` (``--algorithm all``), which wins over the meta's.
CSV (``--csv FILE``) has one line per row: the meta columns first, then the row's keys;
``loadavg`` is the 1-minute figure. Both files are written by rank 0 only.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["META_KEYS", "SCHEMA", "Report"]

SCHEMA = "pycomm-bench/1"

#: The metadata every JSON ``meta`` and every CSV line carries, in this order.
META_KEYS = ("benchmark", "library", "library_version", "world_size", "transport",
             "algorithm", "dtype", "host", "cpu_count", "pycomm_version", "date", "loadavg")


@dataclass
class Report:
    """Prints an OSU-style header and rows on rank 0 and keeps them for JSON/CSV.

    Args:
        title: e.g. ``"OSU MPI Latency Test"``.
        label: library and transport, from ``Comm.label`` (or ``"python sockets"``...).
        columns: (key, title, width, format) per printed column, e.g.
            ``("avg_us", "Avg Latency(us)", 18, ".2f")``; the first is the size in bytes.
        enabled: print and keep rows only where True (rank 0).
        meta: the run's metadata (see :func:`_common.run_metadata`).
    """

    title: str
    label: str
    columns: list[tuple[str, str, int, str]]
    enabled: bool = True
    meta: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def header(self, *extra: str) -> None:
        """Print ``# TITLE (LABEL)``, any extra comment lines, then the column names."""
        if not self.enabled:
            return
        print(f"# {self.title} ({self.label})")
        for line in extra:
            print(f"# {line}")
        names = "".join(f"{title:>{width}}" for _, title, width, _ in self.columns[1:])
        print(f"# {self.columns[0][1]:<{self.columns[0][2] - 2}}{names}", flush=True)

    def format_row(self, values: list[Any]) -> str:
        """Return the printed line for ``values`` (one per column; None prints ``-``)."""
        cells = [f"{values[0]:<{self.columns[0][2]}d}"]
        for (_, _, width, fmt), v in zip(self.columns[1:], values[1:], strict=True):
            cells.append(f"{v:>{width}{fmt}}" if v is not None else f"{'-':>{width}}")
        return "".join(cells)

    def row(self, *values: Any, **fields: Any) -> None:
        """Print one row (size first), keep it with ``fields`` (JSON/CSV only) added."""
        if not self.enabled:
            return
        self.rows.append({**{key: v for (key, _, _, _), v in
                             zip(self.columns, values, strict=True)}, **fields})
        print(self.format_row(list(values)), flush=True)

    def record(self, **fields: Any) -> None:
        """Keep a row for JSON/CSV without printing it (side-by-side tables print their own)."""
        if self.enabled:
            self.rows.append(dict(fields))

    def line(self, text: str) -> None:
        """Print ``text`` as is (rank 0)."""
        if self.enabled:
            print(text, flush=True)

    def document(self, **extra: Any) -> dict[str, Any]:
        """Return the JSON document: schema, names, meta (with ``extra``), machine, rows."""
        from _common import machine_info

        meta = {**self.meta, **extra}
        return {"schema": SCHEMA, "benchmark": meta.get("benchmark", ""), "title": self.title,
                "library": self.label, "meta": meta, "machine": machine_info(),
                "columns": self.keys(), "rows": self.rows}

    def keys(self) -> list[str]:
        """Return the row keys in order: the columns', then any others the rows carry."""
        keys = [key for key, _, _, _ in self.columns
                if not self.rows or any(key in r for r in self.rows)]
        for r in self.rows:
            keys.extend(k for k in r if k not in keys)
        return keys

    def write(self, json_path: str | None, csv_path: str | None, **extra: Any) -> None:
        """Write the rows to ``json_path`` and/or ``csv_path`` (rank 0; None skips)."""
        if not self.enabled:
            return
        doc = self.document(**extra)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
        if csv_path:
            meta = doc["meta"]
            extra_meta = [k for k in meta if k not in META_KEYS]
            row_keys = [k for k in doc["columns"] if k not in META_KEYS or k == "algorithm"]
            head = list(META_KEYS) + [k for k in extra_meta if k not in row_keys] + \
                [k for k in row_keys if k != "algorithm"]
            with open(csv_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=head, extrasaction="ignore")
                w.writeheader()
                for r in doc["rows"]:
                    w.writerow({**{k: _flat(v) for k, v in meta.items()},
                                **{k: _flat(v) for k, v in r.items()}})

    def write_json(self, path: str | None, benchmark: str, **extra: Any) -> None:
        """Write the JSON document only (kept for ``reference.py``)."""
        self.meta.setdefault("benchmark", benchmark)
        self.write(path, None, **extra)


def _flat(value: Any) -> Any:
    """Make a CSV cell: lists become space-separated text, None an empty cell."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return value
