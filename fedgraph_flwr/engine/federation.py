"""The server's side of a personalized federation, free of Flower.

:class:`Federation` owns everything a run remembers: the roster of clients
(keyed by logical id, i.e. partition id), each client's personalized payload,
the aggregator, the per-round records, the checkpoint and the results files.
The Flower strategy (:mod:`fedgraph_flwr.engine.strategy`) only moves messages;
the in-process loop (:mod:`fedgraph_flwr.engine.loop`) drives the same object.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..algorithms import get_algorithm
from ..algorithms.base import Arrays, ClientUpdate, Config
from ..algorithms.supervised import resolve_metric
from ..config import ConfigError, default_run_name

# Metric keys every trainer reports; the headline figure uses these.
VAL, TEST = "val_metric", "test_metric"


@dataclass
class ClientReply:
    """A decoded, not yet validated reply of one client for one round."""

    upload: Arrays
    signature: Arrays
    metrics: dict[str, float]
    bytes_received: int = 0


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

    def mean(self, key: str) -> float:
        values = [m[key] for m in self.clients.values() if key in m and not math.isnan(m[key])]
        return float(np.mean(values)) if values else float("nan")

    def to_json(self) -> dict[str, Any]:
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
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RoundLog:
        ints = lambda m: {int(k): v for k, v in m.items()}  # noqa: E731
        return cls(
            round=d["round"], sampled=list(d["sampled"]), clients=ints(d["clients"]),
            failures=ints(d["failures"]), void=d["void"], aggregate=d["aggregate"],
            bytes_sent=ints(d["bytes_sent"]), bytes_received=ints(d["bytes_received"]),
            times=d["times"],
        )


def nbytes(arrays: Arrays) -> int:
    return int(sum(a.nbytes for a in arrays.values()))


def _atomic_write(path: Path, write) -> None:
    """Write through a temp file in the same folder, then rename: never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _to_tensors(obj: Any) -> Any:
    """numpy -> torch recursively, so checkpoints load with ``weights_only=True``."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k: _to_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_tensors(v) for v in obj)
    return obj


def _to_numpy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_numpy(v) for v in obj)
    return obj


class Federation:
    """Server-side state and bookkeeping of one run.

    ``roster`` maps each logical client id to the facts it reported in the
    handshake (``num-features``, ``num-classes``, ``num-train``, ...).
    """

    def __init__(self, config: Config, roster: dict[int, dict[str, Any]], log=print) -> None:
        self.config = dict(config)
        if not self.config.get("run-name"):
            self.config["run-name"] = default_run_name(self.config)
        self.log = log
        self.roster = dict(sorted(roster.items()))
        self.client_ids = list(self.roster)
        expected = list(range(int(config["num-clients"])))
        if self.client_ids != expected:
            raise ConfigError(
                f"clients reported partition ids {self.client_ids}, expected 0..{expected[-1]}"
            )
        widths = {f["num-features"] for f in self.roster.values()}
        if len(widths) != 1:
            detail = ", ".join(f"client {c}: {f['num-features']}" for c, f in self.roster.items())
            raise ConfigError(f"clients disagree on the feature width ({detail})")
        self.num_features = widths.pop()
        self.num_classes = max(f["num-classes"] for f in self.roster.values())
        for c, f in self.roster.items():
            if f["num-train"] == 0:
                raise ConfigError(f"client {c} has no training node")
        self.algo = get_algorithm(str(config["algorithm"]))
        self.initial = self.algo.trainer.initial_arrays(self.num_features, self.num_classes, self.config)
        self.schema = {k: (v.shape, v.dtype) for k, v in self.initial.items()}
        self.signature_schema: dict[str, tuple[int, ...]] = {}
        self.aggregator = self.algo.aggregator(self.config, self.client_ids, self.initial)
        self.payloads: dict[int, Arrays] = {}
        self.rounds: list[RoundLog] = []
        self.diagnostics: dict[str, list[np.ndarray]] = {}
        self.started = time.time()
        self.elapsed_before_resume = 0.0
        self.out_dir = Path(str(config["output-dir"])).expanduser() / self.config["run-name"]

    # --- what the server sends ----------------------------------------------------
    def client_config(self, server_round: int) -> Config:
        """The run config as the clients see it, plus what the handshake settled."""
        cfg = dict(self.config)
        cfg.update({"server-round": server_round, "num-classes-global": self.num_classes,
                    "num-features-global": self.num_features})
        return cfg

    def sample(self, server_round: int) -> list[int]:
        """The round's participants: all, or a seeded ``fraction`` of them."""
        fraction = float(self.config["fraction"])
        if fraction >= 1.0:
            return list(self.client_ids)
        k = max(1, round(fraction * len(self.client_ids)))
        rng = np.random.default_rng([int(self.config["seed"]), server_round])
        return sorted(int(c) for c in rng.choice(self.client_ids, size=k, replace=False))

    def payload_for(self, client_id: int) -> Arrays:
        """The client's personalized arrays, or the global initial model before it has any."""
        return self.payloads.get(client_id, self.initial)

    # --- what comes back ------------------------------------------------------------
    def check_reply(self, client_id: int, reply: ClientReply) -> str | None:
        """Why a reply must be rejected, or None. Guards the aggregate against poison."""
        upload = reply.upload
        if set(upload) != set(self.schema):
            missing = sorted(set(self.schema) - set(upload))
            extra = sorted(set(upload) - set(self.schema))
            return f"wrong array names (missing {missing[:3]}, unexpected {extra[:3]})"
        limit = int(self.config["max-array-bytes"])
        for name, arr in upload.items():
            shape, dtype = self.schema[name]
            if arr.shape != shape:
                return f"array {name!r} has shape {arr.shape}, expected {shape}"
            if arr.nbytes > limit:
                return f"array {name!r} is {arr.nbytes} bytes, over max-array-bytes={limit}"
            if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
                return f"array {name!r} holds NaN or Inf"
        for name, arr in reply.signature.items():
            if not np.isfinite(arr).all():
                return f"signature {name!r} holds NaN or Inf"
            expected = self.signature_schema.get(name)
            if expected is not None and arr.shape != expected:
                return f"signature {name!r} has shape {arr.shape}, expected {expected}"
        if "train_loss" in reply.metrics and not math.isfinite(reply.metrics["train_loss"]):
            return "train loss is NaN or Inf"
        return None

    def min_replies(self, sampled: list[int]) -> int:
        return int(self.config["min-clients"]) or 1

    def complete_round(
        self,
        server_round: int,
        sampled: list[int],
        replies: dict[int, ClientReply],
        failures: dict[int, str],
        bytes_sent: dict[int, int],
        times: dict[str, float] | None = None,
    ) -> RoundLog:
        """Validate replies, aggregate, store the personalized payloads, record the round."""
        record = RoundLog(round=server_round, sampled=list(sampled), failures=dict(failures),
                          bytes_sent=dict(bytes_sent), times=dict(times or {}))
        updates: dict[int, ClientUpdate] = {}
        for cid, reply in sorted(replies.items()):
            reason = self.check_reply(cid, reply)
            if reason is not None:
                record.failures[cid] = f"rejected: {reason}"
                self.log(f"round {server_round}: client {cid} reply rejected: {reason}")
                continue
            for name, arr in reply.signature.items():
                self.signature_schema.setdefault(name, arr.shape)
            record.clients[cid] = dict(reply.metrics)
            record.bytes_received[cid] = reply.bytes_received
            updates[cid] = ClientUpdate(reply.upload, reply.signature,
                                        int(reply.metrics.get("num-train", 0)), reply.metrics)
        if len(updates) < self.min_replies(sampled):
            record.void = True
            self.log(f"round {server_round}: void, {len(updates)} valid replies "
                     f"< min-clients {self.min_replies(sampled)}")
        else:
            t0 = time.perf_counter()
            result = self.aggregator.aggregate(server_round, updates)
            record.times["aggregate"] = time.perf_counter() - t0
            self.payloads.update(result.payloads)
            record.aggregate = {k: float(v) for k, v in result.metrics.items()}
            for name, matrix in result.diagnostics.items():
                self._store_diagnostic(name, matrix, sorted(updates), server_round)
        self.rounds.append(record)
        return record

    def _store_diagnostic(self, name: str, matrix: np.ndarray, ids: list[int], server_round: int) -> None:
        """Keep a K×K matrix over all clients (NaN where a client did not take part)."""
        full = np.full((len(self.client_ids),) * 2, np.nan, dtype=np.float64)
        idx = np.array([self.client_ids.index(c) for c in ids])
        full[np.ix_(idx, idx)] = matrix
        history = self.diagnostics.setdefault(name, [])
        while len(history) < server_round - 1:
            history.append(np.full_like(full, np.nan))
        history.append(full)

    # --- summaries and files --------------------------------------------------------
    def final(self) -> dict[str, Any]:
        """The papers' protocol: mean test at the best mean-val round, and per-client best-val test."""
        scored = [r for r in self.rounds if not r.void and not math.isnan(r.mean(VAL))]
        if not scored:
            return {"test_at_best_val": float("nan"), "best_round": None}
        best = max(scored, key=lambda r: (r.mean(VAL), -r.round))
        per_client: dict[str, dict[str, float]] = {}
        for cid in self.client_ids:
            seen = [(r.clients[cid][VAL], -r.round, r.clients[cid][TEST], r.round)
                    for r in self.rounds if cid in r.clients and not math.isnan(r.clients[cid][VAL])]
            if seen:
                val, _, test, rnd = max(seen, key=lambda t: (t[0], t[1]))
                per_client[str(cid)] = {"best_round": rnd, "val": 100 * val, "test": 100 * test}
        return {
            "metric": resolve_metric(self.config, self.num_classes),
            "test_at_best_val": 100 * best.mean(TEST),
            "val_at_best_val": 100 * best.mean(VAL),
            "best_round": best.round,
            "per_client_best_val_test": float(np.mean([v["test"] for v in per_client.values()]))
            if per_client else float("nan"),
            "per_client": per_client,
            "total_bytes_sent": int(sum(sum(r.bytes_sent.values()) for r in self.rounds)),
            "total_bytes_received": int(sum(sum(r.bytes_received.values()) for r in self.rounds)),
            "failures": int(sum(len(r.failures) for r in self.rounds)),
            "void_rounds": int(sum(r.void for r in self.rounds)),
        }

    def wall_time(self) -> float:
        return self.elapsed_before_resume + (time.time() - self.started)

    def results(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "clients": {str(c): f for c, f in self.roster.items()},
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "rounds": [r.to_json() for r in self.rounds],
            "wall_time_s": self.wall_time(),
            "final": self.final(),
        }

    def write_results(self) -> Path:
        """results.json, history.csv, diagnostics.npz and heatmaps under ``out_dir``."""
        out = self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(self.results(), indent=1, default=float).encode()
        _atomic_write(out / "results.json", lambda fh: fh.write(payload))
        self._write_history(out / "history.csv")
        if self.diagnostics:
            stacked = {n: np.stack(v) for n, v in self.diagnostics.items()}
            _atomic_write(out / "diagnostics.npz", lambda fh: np.savez(fh, **stacked))
            from ..plots import draw_heatmaps  # matplotlib only when there is something to draw

            draw_heatmaps(stacked, self.client_ids, out)
        return out

    def _write_history(self, path: Path) -> None:
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
                rows.append(row)
        fields = ["round", "client", "status", *keys, "bytes_sent", "bytes_received"]

        def write(fh):
            import io

            text = io.StringIO()
            w = csv.DictWriter(text, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
            fh.write(text.getvalue().encode())

        _atomic_write(path, write)

    # --- checkpoint / resume --------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        """Everything needed to continue after the last completed round (atomic)."""
        state = {
            "round": self.rounds[-1].round if self.rounds else 0,
            "payloads": _to_tensors({int(c): p for c, p in self.payloads.items()}),
            "aggregator": _to_tensors(self.aggregator.state_dict()),
            "rounds_json": json.dumps([r.to_json() for r in self.rounds], default=float),
            "diagnostics": _to_tensors({n: list(v) for n, v in self.diagnostics.items()}),
            "signature_schema": {k: list(v) for k, v in self.signature_schema.items()},
            "elapsed": self.wall_time(),
        }
        _atomic_write(self.checkpoint_path, lambda fh: torch.save(state, fh))

    def load_checkpoint(self) -> int:
        """Restore a checkpoint; return the last completed round (0 if none)."""
        if not self.checkpoint_path.is_file():
            raise ConfigError(f"resume=true but there is no checkpoint at {self.checkpoint_path}")
        state = torch.load(self.checkpoint_path, weights_only=True)
        self.payloads = {int(c): _to_numpy(p) for c, p in state["payloads"].items()}
        self.aggregator.load_state_dict(_to_numpy(state["aggregator"]))
        self.rounds = [RoundLog.from_json(d) for d in json.loads(state["rounds_json"])]
        self.diagnostics = {n: [t.numpy() for t in v] for n, v in state["diagnostics"].items()}
        self.signature_schema = {k: tuple(v) for k, v in state["signature_schema"].items()}
        self.elapsed_before_resume = float(state["elapsed"])
        self.started = time.time()
        return int(state["round"])
