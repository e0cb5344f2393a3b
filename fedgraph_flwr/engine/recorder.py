"""The run's record: one :class:`RoundLog` per round, the server's diagnostics, and
the files written from them (results.json, history.csv, costs.png, heatmaps), each
written atomically so a reader never sees half a file."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write
from ..core.phases import Arrays

# Metric keys every trainer reports; the headline figure uses these.
VAL, TEST = "val_metric", "test_metric"


def nbytes(arrays: Arrays) -> int:
    """Total bytes of ``arrays``."""
    return int(sum(a.nbytes for a in arrays.values()))


@dataclass
class RoundLog:
    """Everything recorded about one round (becomes one entry of results.json)."""

    round: int
    sampled: list[int]
    clients: dict[int, dict[str, float]] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    void: bool = False
    aggregate: dict[str, float] = field(default_factory=dict)
    bytes_sent: dict[int, int] = field(default_factory=dict)
    bytes_received: dict[int, int] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    # per client, seconds: "train" (local training, client-measured), "wait" (server
    # side, from sending the round's messages to this client's reply arriving)
    client_times: dict[int, dict[str, float]] = field(default_factory=dict)
    # per client, what robust aggregation did to its update (clipped, left out, capped)
    robust: dict[int, str] = field(default_factory=dict)

    def mean(self, key: str) -> float:
        """Mean of metric ``key`` over the clients that reported it (NaN: none did)."""
        values = [m[key] for m in self.clients.values() if key in m and not math.isnan(m[key])]
        return float(np.mean(values)) if values else float("nan")

    def to_json(self) -> dict[str, Any]:
        """This round as an entry of results.json."""
        return {
            "round": self.round,
            "sampled": self.sampled,
            "void": self.void,
            "mean_val": self.mean(VAL),
            "mean_test": self.mean(TEST),
            "mean_train_loss": self.mean("train_loss"),
            "clients": {str(c): m for c, m in sorted(self.clients.items())},
            "failures": {str(c): r for c, r in sorted(self.failures.items())},
            "aggregate": self.aggregate,
            "bytes_sent": {str(c): b for c, b in sorted(self.bytes_sent.items())},
            "bytes_received": {str(c): b for c, b in sorted(self.bytes_received.items())},
            "times": self.times,
            "client_times": {str(c): t for c, t in sorted(self.client_times.items())},
            "robust": {str(c): r for c, r in sorted(self.robust.items())},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RoundLog:
        """A round back from its results.json entry (resume)."""
        ints = lambda m: {int(k): v for k, v in m.items()}  # noqa: E731
        return cls(
            round=d["round"], sampled=list(d["sampled"]), clients=ints(d["clients"]),
            failures=ints(d["failures"]), void=d["void"], aggregate=d["aggregate"],
            bytes_sent=ints(d["bytes_sent"]), bytes_received=ints(d["bytes_received"]),
            times=d["times"], client_times=ints(d.get("client_times", {})),
            robust=ints(d.get("robust", {})),
        )


class Recorder:
    """The rounds so far and the K×K diagnostics (NaN where a client sat out)."""

    def __init__(self, client_ids: list[int],
                 write_report: Callable[[dict[str, Any], Path], Path] | None = None) -> None:
        self.client_ids = list(client_ids)
        # report.html is the product's page, not the engine's: whoever builds the run
        # hands its writer in (Federation), so the engine imports no report module.
        self.write_report = write_report
        self.rounds: list[RoundLog] = []
        self.diagnostics: dict[str, list[np.ndarray]] = {}

    def store_diagnostic(self, name: str, matrix: np.ndarray, ids: list[int], server_round: int) -> None:
        """Keep a K×K matrix over all clients (NaN where a client did not take part)."""
        full = np.full((len(self.client_ids),) * 2, np.nan, dtype=np.float64)
        idx = np.array([self.client_ids.index(c) for c in ids])
        full[np.ix_(idx, idx)] = matrix
        history = self.diagnostics.setdefault(name, [])
        while len(history) < server_round - 1:
            history.append(np.full_like(full, np.nan))
        history.append(full)

    def write(self, results: dict[str, Any], out: Path) -> Path:
        """results.json, history.csv, costs.png, diagnostics.npz, heatmaps and (through
        ``write_report``) report.html under ``out``."""
        out.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(results, indent=1, default=float).encode()
        atomic_write(out / "results.json", lambda fh: fh.write(payload))
        self.write_history(out / "history.csv")
        from ..plots import draw_round_costs  # matplotlib only when files are written

        draw_round_costs([r.to_json() for r in self.rounds], out / "costs.png")
        if self.diagnostics:
            stacked = {n: np.stack(v) for n, v in self.diagnostics.items()}
            # numpy's stubs take **arrays for its allow_pickle keyword
            atomic_write(out / "diagnostics.npz",
                         lambda fh: np.savez(fh, **stacked))  # type: ignore[arg-type]
            from ..plots import draw_heatmaps

            draw_heatmaps(stacked, self.client_ids, out)
        if self.write_report is not None:
            self.write_report(results, out)  # last: it embeds the PNGs drawn above
        return out

    def write_history(self, path: Path) -> None:
        """history.csv: one row per sampled client and round."""
        keys: list[str] = []
        for r in self.rounds:
            for m in r.clients.values():
                keys += [k for k in m if k not in keys]
        rows = []
        for r in self.rounds:
            for cid in r.sampled:
                row = {"round": r.round, "client": cid, "status": (
                    "ok" if cid in r.clients else r.failures.get(cid, "missing"))}
                row.update(r.clients.get(cid, {}))
                row["bytes_sent"] = r.bytes_sent.get(cid, 0)
                row["bytes_received"] = r.bytes_received.get(cid, 0)
                row["time_wait"] = r.client_times.get(cid, {}).get("wait", "")
                rows.append(row)
        fields = ["round", "client", "status", *keys, "bytes_sent", "bytes_received", "time_wait"]

        def write(fh):
            import io

            text = io.StringIO()
            w = csv.DictWriter(text, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
            fh.write(text.getvalue().encode())

        atomic_write(path, write)


