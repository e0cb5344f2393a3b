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
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..algorithms import get_algorithm
from ..algorithms.base import Arrays, ClientUpdate, Config
from ..algorithms.supervised import resolve_metric
from ..config import ConfigError, default_run_name
from . import state_codec

# Metric keys every trainer reports; the headline figure uses these.
VAL, TEST = "val_metric", "test_metric"

# Config keys that may change between a run and its resume (limits, paths, logging);
# every other key must match the checkpoint's, or resuming would mix two experiments.
RESUMABLE_CHANGES = frozenset({
    "rounds", "resume", "fail-fast", "round-timeout", "handshake-timeout", "min-clients",
    "verbose", "output-dir", "data-root", "partition-dir", "config-file", "client-state",
    "client-state-dir", "max-array-bytes",
})


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
    # per client, seconds: "train" (local training, client-measured), "wait" (server
    # side, from sending the round's messages to this client's reply arriving)
    client_times: dict[int, dict[str, float]] = field(default_factory=dict)

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
            "client_times": {str(c): t for c, t in sorted(self.client_times.items())},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RoundLog:
        ints = lambda m: {int(k): v for k, v in m.items()}  # noqa: E731
        return cls(
            round=d["round"], sampled=list(d["sampled"]), clients=ints(d["clients"]),
            failures=ints(d["failures"]), void=d["void"], aggregate=d["aggregate"],
            bytes_sent=ints(d["bytes_sent"]), bytes_received=ints(d["bytes_received"]),
            times=d["times"], client_times=ints(d.get("client_times", {})),
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
        # Names this run's client state files (client-state=file); kept across resume.
        self.state_token = uuid.uuid4().hex[:12]
        self.out_dir = Path(str(config["output-dir"])).expanduser() / self.config["run-name"]

    # --- what the server sends ----------------------------------------------------
    def client_config(self, server_round: int) -> Config:
        """The run config as the clients see it, plus what the handshake settled."""
        cfg = dict(self.config)
        cfg.update({"server-round": server_round, "num-classes-global": self.num_classes,
                    "num-features-global": self.num_features,
                    "client-state-token": self.state_token})
        return cfg

    def sample(self, server_round: int) -> list[int]:
        """The round's participants: all, or a seeded ``fraction`` of them."""
        fraction = float(self.config["fraction"])
        if fraction >= 1.0:
            return list(self.client_ids)
        # The FedIIH reference's rule (spec fediih.md §10.6):
        # np.random.seed(seed + r); choice(M, round(M * frac), replace=False).
        k = max(1, round(fraction * len(self.client_ids)))
        rng = np.random.RandomState(int(self.config["seed"]) + server_round)
        chosen = rng.choice(len(self.client_ids), k, replace=False)
        return sorted(self.client_ids[int(i)] for i in chosen)

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
        waits: dict[int, float] | None = None,
        aggregate: bool = True,
    ) -> RoundLog:
        """Validate replies, aggregate, store the personalized payloads, record the round.

        ``waits``: per client, server-side seconds until its reply arrived.
        ``aggregate=False`` records the round as void without touching any payload
        (fail-fast: the run stops here).
        """
        record = RoundLog(round=server_round, sampled=list(sampled), failures=dict(failures),
                          bytes_sent=dict(bytes_sent), times=dict(times or {}))
        for cid, wait in sorted((waits or {}).items()):
            record.client_times.setdefault(cid, {})["wait"] = float(wait)
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
            record.client_times.setdefault(cid, {})["train"] = float(
                reply.metrics.get("time-train", float("nan")))
            updates[cid] = ClientUpdate(reply.upload, reply.signature,
                                        int(reply.metrics.get("num-train", 0)), reply.metrics)
        record.times["aggregate"] = 0.0
        if not aggregate:
            record.void = True
        elif len(updates) < self.min_replies(sampled):
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
    def held_metrics(self) -> dict[int, dict[int, dict[str, float]] | None]:
        """Per round: every client's metrics of the model it holds after that round.

        A client that did not train in a round (not sampled, or failed) still holds
        the model of its last round, whose metrics it reported then; they carry over.
        None until every client has reported once.
        """
        latest: dict[int, dict[str, float]] = {}
        out: dict[int, dict[int, dict[str, float]] | None] = {}
        for r in self.rounds:
            for cid, m in r.clients.items():
                if not math.isnan(m.get(VAL, float("nan"))):
                    latest[cid] = m
            out[r.round] = dict(latest) if len(latest) == len(self.client_ids) else None
        return out

    def held_means(self) -> dict[int, tuple[float, float]]:
        """Per round: mean (val, test) over *all* clients' held models (NaN before all
        have reported). With full participation this is each round's mean over its
        replies; with ``fraction`` < 1 it avoids picking the "best" round by the luck
        of which few clients were sampled."""
        out: dict[int, tuple[float, float]] = {}
        for rnd, held in self.held_metrics().items():
            out[rnd] = ((float(np.mean([m[VAL] for m in held.values()])),
                         float(np.mean([m[TEST] for m in held.values()])))
                        if held else (float("nan"), float("nan")))
        return out

    def pooled_at_best_val_loss(self) -> dict[str, Any]:
        """FedSpray's protocol (fedspray.md §7): the round of lowest pooled validation
        loss Σ_k CE_k·|val_k| / Σ_k |val_k|, and there the pooled (micro) overall,
        minority and majority test accuracy, plus the macro figures (unweighted means
        over clients of their own overall and minority accuracy). Empty if the trainer
        reports no counts."""
        keys = ("val_loss_sum", "val_count", "test_correct", "test_count",
                "minority_correct", "minority_count")
        best: tuple[float, int, dict[str, float]] | None = None
        held_by_round = self.held_metrics()
        for r in self.rounds:
            held = held_by_round[r.round]
            if r.void or not held or not all(k in m for m in held.values() for k in keys):
                continue
            total = {k: float(sum(m[k] for m in held.values())) for k in keys}
            if total["val_count"] == 0:
                continue
            loss = total["val_loss_sum"] / total["val_count"]
            if best is None or loss < best[0]:
                best = (loss, r.round, total)
        if best is None:
            return {}
        loss, rnd, t = best
        majority_count = t["test_count"] - t["minority_count"]
        held = held_by_round[rnd]
        minority = [m["minority_metric"] for m in held.values()
                    if not math.isnan(m.get("minority_metric", float("nan")))]
        return {
            "macro_test_at_best_val_loss": 100 * float(np.mean([m[TEST] for m in held.values()])),
            "macro_minority_at_best_val_loss":
                100 * float(np.mean(minority)) if minority else float("nan"),
            "pooled_best_round": rnd,
            "pooled_val_loss": loss,
            "pooled_test_at_best_val_loss": 100 * t["test_correct"] / t["test_count"],
            "pooled_minority_at_best_val_loss":
                100 * t["minority_correct"] / t["minority_count"] if t["minority_count"] else float("nan"),
            "pooled_majority_at_best_val_loss":
                100 * (t["test_correct"] - t["minority_correct"]) / majority_count
                if majority_count else float("nan"),
        }

    def final(self) -> dict[str, Any]:
        """The papers' protocol: mean test at the best mean-val round, and per-client best-val test.

        "Mean" is over all clients' held models (:meth:`held_means`).
        """
        held = self.held_means()
        scored = [r for r in self.rounds if not r.void and not math.isnan(held[r.round][0])]
        if not scored:
            return {"test_at_best_val": float("nan"), "best_round": None}
        best = max(scored, key=lambda r: (held[r.round][0], -r.round))
        per_client: dict[str, dict[str, float]] = {}
        for cid in self.client_ids:
            seen = [(r.clients[cid][VAL], -r.round, r.clients[cid][TEST], r.round)
                    for r in self.rounds if cid in r.clients and not math.isnan(r.clients[cid][VAL])]
            if seen:
                val, _, test, rnd = max(seen, key=lambda t: (t[0], t[1]))
                per_client[str(cid)] = {"best_round": rnd, "val": 100 * val, "test": 100 * test}
        return {
            "metric": resolve_metric(self.config, self.num_classes),
            "test_at_best_val": 100 * held[best.round][1],
            "val_at_best_val": 100 * held[best.round][0],
            "best_round": best.round,
            "per_client_best_val_test": float(np.mean([v["test"] for v in per_client.values()]))
            if per_client else float("nan"),
            "per_client": per_client,
            **self.pooled_at_best_val_loss(),
            "total_bytes_sent": int(sum(sum(r.bytes_sent.values()) for r in self.rounds)),
            "total_bytes_received": int(sum(sum(r.bytes_received.values()) for r in self.rounds)),
            "failures": int(sum(len(r.failures) for r in self.rounds)),
            "failures_by_client": self._failures_by_client(),
            "void_rounds": int(sum(r.void for r in self.rounds)),
            **self.total_times(),
        }

    def _failures_by_client(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rounds:
            for cid in r.failures:
                counts[str(cid)] = counts.get(str(cid), 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))

    def total_times(self) -> dict[str, float]:
        """Seconds summed over rounds: clients' local training (summed over clients),
        the server's wait for replies, aggregation, and whole rounds."""
        def total(values) -> float:
            return float(sum(v for v in values if not math.isnan(v)))

        return {
            "total_time_train_s": total(t.get("train", float("nan")) for r in self.rounds
                                        for t in r.client_times.values()),
            "total_time_wait_s": total(r.times.get("wait", float("nan")) for r in self.rounds),
            "total_time_aggregate_s": total(r.times.get("aggregate", float("nan"))
                                            for r in self.rounds),
            "total_time_round_s": total(r.times.get("round", float("nan")) for r in self.rounds),
        }

    def wall_time(self) -> float:
        return self.elapsed_before_resume + (time.time() - self.started)

    def results(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "clients": {str(c): f for c, f in self.roster.items()},
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "rounds": self._rounds_json(),
            "wall_time_s": self.wall_time(),
            "final": self.final(),
        }

    def _rounds_json(self) -> list[dict[str, Any]]:
        """Each round's record plus the all-client means of :meth:`held_means`."""
        held = self.held_means()
        return [{**r.to_json(), "held_mean_val": held[r.round][0],
                 "held_mean_test": held[r.round][1]} for r in self.rounds]

    def write_results(self) -> Path:
        """results.json, history.csv, costs.png, diagnostics.npz and heatmaps under ``out_dir``."""
        out = self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(self.results(), indent=1, default=float).encode()
        _atomic_write(out / "results.json", lambda fh: fh.write(payload))
        self._write_history(out / "history.csv")
        from ..plots import draw_round_costs  # matplotlib only when files are written

        draw_round_costs([r.to_json() for r in self.rounds], out / "costs.png")
        if self.diagnostics:
            stacked = {n: np.stack(v) for n, v in self.diagnostics.items()}
            _atomic_write(out / "diagnostics.npz", lambda fh: np.savez(fh, **stacked))
            from ..plots import draw_heatmaps

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

        _atomic_write(path, write)

    # --- checkpoint / resume --------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        """Everything needed to continue after the last completed round (atomic)."""
        state = {
            "round": self.rounds[-1].round if self.rounds else 0,
            "config_json": json.dumps(self.config, default=str),
            "state_token": self.state_token,
            "payloads": {int(c): p for c, p in self.payloads.items()},  # numpy: stored as tensors
            "aggregator": self.aggregator.state_dict(),
            "rounds_json": json.dumps([r.to_json() for r in self.rounds], default=float),
            "diagnostics": {n: list(v) for n, v in self.diagnostics.items()},
            "signature_schema": {k: list(v) for k, v in self.signature_schema.items()},
            "elapsed": self.wall_time(),
        }
        _atomic_write(self.checkpoint_path, lambda fh: fh.write(state_codec.encode(state)))

    def load_checkpoint(self) -> int:
        """Restore a checkpoint; return the last completed round (0 if none)."""
        if not self.checkpoint_path.is_file():
            raise ConfigError(f"resume=true but there is no checkpoint at {self.checkpoint_path}")
        try:
            state = state_codec.decode(self.checkpoint_path.read_bytes())
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file
            raise ConfigError(f"resume=true but {self.checkpoint_path} is unreadable: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                              ) from None
        if "config_json" in state:
            saved = json.loads(state["config_json"])
            changed = [k for k in sorted(set(saved) | set(self.config))
                       if k not in RESUMABLE_CHANGES and saved.get(k) != self.config.get(k)]
            if changed:
                detail = ", ".join(f"{k}={saved.get(k)!r} -> {self.config.get(k)!r}"
                                   for k in changed[:4])
                raise ConfigError(f"resume=true but the checkpoint at {self.checkpoint_path} is "
                                  f"of a different run ({detail}); use the same settings or "
                                  f"another run-name")
        self.state_token = str(state.get("state_token", self.state_token))
        self.payloads = {int(c): _to_numpy(p) for c, p in state["payloads"].items()}
        self.aggregator.load_state_dict(_to_numpy(state["aggregator"]))
        self.rounds = [RoundLog.from_json(d) for d in json.loads(state["rounds_json"])]
        self.diagnostics = {n: [t.numpy() for t in v] for n, v in state["diagnostics"].items()}
        self.signature_schema = {k: tuple(v) for k, v in state["signature_schema"].items()}
        self.elapsed_before_resume = float(state["elapsed"])
        self.started = time.time()
        return int(state["round"])

    def first_round(self) -> int:
        """The round to start with: 1, or after the checkpoint's last round if ``resume``."""
        if not self.config["resume"]:
            return 1
        done = self.load_checkpoint()
        self.log(f"resumed from {self.checkpoint_path} after round {done} "
                 f"({len(self.rounds)} rounds of history)")
        if self.config["client-state"] == "context":
            self.log("warning: resume=true with client-state=context: clients restart their "
                     "local state (optimiser moments, local-only layers) from scratch, so "
                     "results will differ from an uninterrupted run; use client-state=file "
                     "(state files under client-state-dir survive the restart) to resume exactly")
        return done + 1
