"""A curious server, measured: what it infers from exactly what it receives (issue #56 item 3).

    OMP_NUM_THREADS=1 python benchmarks/privacy_attacks.py --data-root DATA --out OUT \
        [--methods fedavg fedpub fedaux fediih fedspray] [--settings off signature client] \
        [--rounds 20] [--seed 0] [--dp-epsilon 4] [--doc docs/results/privacy-attacks.md]

Each (method, DP setting) runs the target federation (``--dataset``, ``--num-clients``,
METIS, the method's defaults) in process through :class:`RecordingTransport`, which keeps
what the server receives: every reply's upload and signature, in every phase of every
round (and what the server itself sent). The attacks read only those records, and the
shadow federations' own:

(a) **Label distribution.** The attacker trains SHADOW federations of the same method and
    settings on other partitions of the same dataset (METIS with other client counts,
    Louvain with two seeds: never the target's node sets), whose clients' label
    distributions it knows, and fits a ridge regression from one fixed feature vector per
    client (:func:`label_features`: per-class rows of the uploaded weights, their change
    against what the server sent, and the signature's arrays, flattened) to the client's
    label distribution (over all its nodes). Applied to the target's last-round replies;
    the error is the mean total-variation distance to the truth, against guessing the
    dataset's label prior for every client.
(b) **Membership** (loss threshold, Yeom et al. 2018). The client's last uploaded arrays
    are loaded into the method's own trainer built on the client's subgraph
    (:func:`reconstructed_logits`), and each training node (member) and test node
    (non-member) is scored by minus its cross-entropy; the ROC AUC of that score
    (0.5 = chance) per client, averaged, and pooled over all clients' nodes.

(c) **Label distribution, one round, no shadows** (``--attack sign``, issue #76). With
    full-batch Adam and one local epoch, a client's first-round change of each uploaded
    per-class row ([C, d]: the classifier) is −lr·sign of the cross-entropy gradient
    Σ_i (p_ic − y_ic) h_i: a coordinate rises where class c's labelled nodes carry more of
    feature j than the model's near-uniform predictions do, so the share of rising
    coordinates in row c grows with class c's share of the training labels. That share,
    normalised over the classes, is the guess (:func:`sign_label_estimate`); nothing is
    trained. Errors: mean TV to the training labels' and to all nodes' distribution, and
    how many clients' majority training class it names, against the uniform and the
    dataset-prior guesses.

Results: one JSON per (method, setting) under ``--out`` (an existing one is skipped: the
runs resume), and the table between the markers of ``--doc``. DP settings the installed
version has no ``dp`` config key for are reported as "not run".
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

# The project's modules are imported where used: the attacks' maths (tests/test_privacy_attacks.py)
# need only numpy and torch.
Arrays = dict[str, np.ndarray]

METHODS = ("fedavg", "fedpub", "fedaux", "fediih", "fedspray")
SETTINGS = ("off", "signature", "client")
#: The shadow federations (partitions the attacker trains itself), as run-config overrides;
#: none has the target's node sets (METIS with 10 clients).
SHADOWS: tuple[dict[str, Any], ...] = (
    {"partition": "metis", "num-clients": 5},
    {"partition": "metis", "num-clients": 15},
    {"partition": "metis", "num-clients": 20},
    {"partition": "louvain", "num-clients": 10, "partition-seed": 1234},
    {"partition": "louvain", "num-clients": 10, "partition-seed": 7},
)
#: Arrays of at most this many elements are kept for every round; larger ones only for
#: the last round (what the attacks read), so that a run's record stays small.
SMALL = 65_536
RIDGE_ALPHAS = tuple(10.0 ** k for k in range(-2, 5))
DOC_BEGIN = "<!-- privacy-attacks table: begin -->"
DOC_END = "<!-- privacy-attacks table: end -->"
SIGN_BEGIN = "<!-- sign attack table: begin -->"
SIGN_END = "<!-- sign attack table: end -->"


# --- what the server receives ---------------------------------------------------------------
@dataclass
class Received:
    """One client's exchange in one phase of one round, as the server saw it."""

    sent: Arrays
    upload: Arrays
    signature: Arrays
    metrics: dict[str, float]  # kept for context (the models' accuracy); no attack reads them


class RecordingTransport:
    """A transport (:class:`~fedgraph_flwr.engine.transport.Transport`'s methods) that
    hands everything to ``inner`` (default: the in-process transport) and records every
    reply, and what was sent, per round, phase and client. ``last_round``: the round whose
    arrays are all kept; earlier rounds keep the arrays of at most :data:`SMALL` elements."""

    def __init__(self, last_round: int, inner: Any = None) -> None:
        if inner is None:
            from fedgraph_flwr.engine.loop import InProcessTransport

            inner = InProcessTransport()
        self.inner = inner
        self.last_round = last_round
        self.records: dict[tuple[int, str, int], Received] = {}
        self.configs: dict[int, Any] = {}  # each client's last train-phase ClientConfig

    @property
    def data(self) -> dict[int, Any]:
        """Each client's subgraph (the in-process transport's; the membership attack's
        candidate nodes)."""
        return self.inner.data

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def connect(self, config: Any) -> dict[int, dict[str, Any]]:
        return self.inner.connect(config)

    def refresh(self, config: Any, deadline: float | None = None) -> None:
        self.inner.refresh(config, deadline)

    def exchange(self, phase: Any, requests: dict[int, Any], timeout: float) -> Any:
        out = self.inner.exchange(phase, requests, timeout)
        for cid, reply in out.replies.items():
            request = requests[cid]
            rnd = request.config.server_round
            keep = (lambda a: True) if rnd == self.last_round else (lambda a: a.size <= SMALL)
            self.records[(rnd, phase.name, cid)] = Received(
                sent={k: np.array(v) for k, v in request.arrays.items() if keep(v)},
                upload={k: np.array(v) for k, v in reply.upload.items() if keep(v)},
                signature={k: np.array(v) for k, v in reply.signature.items()},
                metrics=dict(reply.metrics),
            )
            if phase.name == "train":
                self.configs[cid] = request.config
        return out

    def label_distribution(self, cid: int, num_classes: int) -> np.ndarray:
        """Client ``cid``'s label distribution over all its nodes (the attack's target)."""
        y = self.data[cid].y.cpu().numpy()
        return np.bincount(y, minlength=num_classes)[:num_classes] / max(len(y), 1)


def run_recorded(overrides: Mapping[str, Any]) -> tuple[RecordingTransport, Any]:
    """One federation in process, nothing written; its recording transport and config."""
    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.driver import RoundDriver
    from fedgraph_flwr.privacy.mechanism import NOISE_KEY_ENV

    config = resolve_config(None, overrides)
    transport = RecordingTransport(last_round=config.rounds)
    # Every federation's owners get a fresh noise key, unknown to the attacker (as
    # FEDGRAPH_DP_NOISE_KEY on each SuperNode). Without one the noise is seeded by the run's
    # seed, client, round and phase: shadow federations run with the same seed then carry
    # the target's very noise, and the attack reads through it (docs/results/privacy-attacks.md).
    before = os.environ.get(NOISE_KEY_ENV)
    if config.dp != "off" and KEYED_NOISE:
        os.environ[NOISE_KEY_ENV] = secrets.token_hex(16)
    try:
        RoundDriver(config, transport, write=False).run()
    finally:
        if before is None:
            os.environ.pop(NOISE_KEY_ENV, None)
        else:
            os.environ[NOISE_KEY_ENV] = before
    return transport, config


#: --noise keyed (default): each federation's DP noise keyed by a fresh secret.
KEYED_NOISE = True


# --- (a) label distribution ---------------------------------------------------------------------
def label_features(received: Sequence[tuple[str, Received]], num_classes: int
                   ) -> dict[str, np.ndarray]:
    """One client's feature groups from its replies in one round (``(phase, Received)``).

    ``weights``: for every uploaded array with one row per class ([C, d]: a classifier),
    its rows' L2 norms and the norms of their change against what the server sent; for
    every [C] array (a bias), its values and their change. ``signature``: every signature
    array, and every non-train phase's upload, flattened (sorted by phase and name)."""
    weights: list[np.ndarray] = []
    signature: list[np.ndarray] = []
    for phase, rec in sorted(received, key=lambda pr: pr[0]):
        for name in sorted(rec.upload):
            value = np.asarray(rec.upload[name], dtype=np.float64)
            sent = rec.sent.get(name)
            delta = value - sent if sent is not None and np.shape(sent) == value.shape else None
            if phase == "train" and value.ndim == 2 and value.shape[0] == num_classes:
                weights.append(np.linalg.norm(value, axis=1))
                if delta is not None:
                    weights.append(np.linalg.norm(delta, axis=1))
            elif phase == "train" and value.shape == (num_classes,):
                weights.append(value)
                if delta is not None:
                    weights.append(delta)
            elif phase != "train":
                signature.append(value.ravel())
        for name in sorted(rec.signature):
            signature.append(np.asarray(rec.signature[name], dtype=np.float64).ravel())
    out = {"weights": np.concatenate(weights) if weights else np.zeros(0)}
    out["signature"] = np.concatenate(signature) if signature else np.zeros(0)
    out["all"] = np.concatenate([out["weights"], out["signature"]])
    return out


def fit_ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, ...]:
    """Ridge regression of ``y`` [n, C] on standardised ``x`` [n, d] (dual form:
    n is small, d may be large); returns (mean, scale, weights [d, C], intercept [C])."""
    mean = x.mean(0)
    scale = x.std(0)
    scale[scale < 1e-12] = 1.0
    z = (x - mean) / scale
    y_mean = y.mean(0)
    gram = z @ z.T
    dual = np.linalg.solve(gram + alpha * np.eye(len(z)), y - y_mean)
    return mean, scale, z.T @ dual, y_mean


def predict_ridge(model: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
    """The fitted map, projected onto distributions (clipped at 0, rows renormalised)."""
    mean, scale, w, b = model
    raw = ((x - mean) / scale) @ w + b
    raw = np.clip(raw, 0.0, None)
    sums = raw.sum(1, keepdims=True)
    uniform = np.full_like(raw, 1.0 / raw.shape[1])
    return np.where(sums > 0, raw / np.where(sums > 0, sums, 1.0), uniform)


def total_variation(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row-wise total-variation distance, ½ Σ |p − q|."""
    return 0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum(-1)


def pick_alpha(x: np.ndarray, y: np.ndarray, groups: np.ndarray,
               alphas: Sequence[float] = RIDGE_ALPHAS) -> float:
    """The ridge penalty of least mean total variation, leaving out one group (one shadow
    federation) at a time; the smallest on ties. One group: the middle of the grid."""
    ids = np.unique(groups)
    if len(ids) < 2:
        return float(alphas[len(alphas) // 2])
    errors = []
    for alpha in alphas:
        err = [total_variation(predict_ridge(fit_ridge(x[groups != g], y[groups != g], alpha),
                                             x[groups == g]), y[groups == g]).mean() for g in ids]
        errors.append(float(np.mean(err)))
    return float(alphas[int(np.argmin(errors))])


def label_attack(x_shadow: np.ndarray, y_shadow: np.ndarray, groups: np.ndarray,
                 x_target: np.ndarray, y_target: np.ndarray, prior: np.ndarray) -> dict[str, Any]:
    """Fit on the shadow clients, predict the target's; errors against the prior guess."""
    alpha = pick_alpha(x_shadow, y_shadow, groups)
    pred = predict_ridge(fit_ridge(x_shadow, y_shadow, alpha), x_target)
    err = total_variation(pred, y_target)
    base = total_variation(np.broadcast_to(prior, y_target.shape), y_target)
    return {"alpha": alpha, "tv": float(err.mean()), "prior_tv": float(base.mean()),
            "tv_per_client": [round(float(e), 4) for e in err],
            "prior_tv_per_client": [round(float(e), 4) for e in base],
            "predicted": np.round(pred, 4).tolist()}


def direct_reads(transport: RecordingTransport, num_classes: int, truth: np.ndarray
                 ) -> dict[str, float]:
    """Signature arrays that already are a distribution over the classes ([C], >= 0,
    summing to 1: FedSpray's ``class_ratios``, its training labels' shares), read as the
    prediction with no attack at all: their mean total variation to the truth, by name."""
    rnd, out = transport.last_round, {}
    clients = [c for c in sorted(transport.data) if (rnd, "train", c) in transport.records]
    for name, value in transport.records[(rnd, "train", clients[0])].signature.items():
        if value.shape != (num_classes,) or value.min() < 0 or abs(value.sum() - 1) > 1e-4:
            continue
        read = np.stack([transport.records[(rnd, "train", c)].signature[name] for c in clients])
        out[name] = float(total_variation(read, truth).mean())
    return out


# --- (c) label distribution from one round's classifier signs ------------------------------
def sign_label_estimate(sent: Arrays, upload: Arrays, num_classes: int) -> np.ndarray | None:
    """A client's label distribution [C] guessed from one reply: the share of positive
    entries in each class's row of the change of every uploaded [C, d] array (d > 1),
    normalised to sum 1 (uniform when no entry rose); None without such an array."""
    rows = [np.asarray(upload[n], np.float64) - np.asarray(sent[n], np.float64)
            for n in sorted(upload)
            if n in sent and np.ndim(upload[n]) == 2 and np.shape(upload[n])[0] == num_classes
            and np.shape(upload[n])[1] > 1 and np.shape(sent[n]) == np.shape(upload[n])]
    if not rows:
        return None
    rising = (np.concatenate(rows, axis=1) > 0).mean(axis=1)
    total = rising.sum()
    return rising / total if total > 0 else np.full(num_classes, 1.0 / num_classes)


def sign_attack(transport: RecordingTransport, num_classes: int, server_round: int = 1
                ) -> dict[str, Any]:
    """:func:`sign_label_estimate` on every client's ``server_round`` train reply, scored
    against its training labels' and all its nodes' distribution, and against guessing
    uniform or the dataset's label prior (over all the federation's nodes)."""
    clients, guesses, train_truth, all_truth = [], [], [], []
    for cid in sorted(transport.data):
        rec = transport.records.get((server_round, "train", cid))
        if rec is None:
            continue
        guess = sign_label_estimate(rec.sent, rec.upload, num_classes)
        if guess is None:
            raise ValueError("no uploaded [C, d] array: nothing for the sign attack to read")
        data = transport.data[cid]
        y = data.y.cpu().numpy()
        train = y[data.train_mask.cpu().numpy()]
        clients.append(cid)
        guesses.append(guess)
        train_truth.append(np.bincount(train, minlength=num_classes)[:num_classes] / len(train))
        all_truth.append(np.bincount(y, minlength=num_classes)[:num_classes] / len(y))
    guess, train_y, all_y = np.array(guesses), np.array(train_truth), np.array(all_truth)
    sizes = np.array([transport.data[c].num_nodes for c in clients], np.float64)
    prior = (sizes[:, None] * all_y).sum(0) / sizes.sum()
    uniform = np.full(num_classes, 1.0 / num_classes)

    def scored(pred: np.ndarray) -> dict[str, Any]:
        pred = np.broadcast_to(pred, guess.shape)
        return {"tv_train": float(total_variation(pred, train_y).mean()),
                "tv_all": float(total_variation(pred, all_y).mean()),
                "majority_hits": int((pred.argmax(1) == train_y.argmax(1)).sum())}

    return {"clients": clients, "round": server_round, **scored(guess),
            "uniform": scored(uniform), "prior": scored(prior),
            "tv_train_per_client": [round(float(e), 4) for e in total_variation(guess, train_y)],
            "predicted": np.round(guess, 4).tolist(), "train_truth": np.round(train_y, 4).tolist(),
            "prior_distribution": np.round(prior, 4).tolist()}


# --- (b) membership -------------------------------------------------------------------------
def roc_auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counting ½ (Mann-Whitney)."""
    pos = np.asarray(positive, dtype=np.float64).ravel()
    neg = np.asarray(negative, dtype=np.float64).ravel()
    if not len(pos) or not len(neg):
        return float("nan")
    both = np.concatenate([pos, neg])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(len(both))
    sorted_scores = both[order]
    start = 0
    while start < len(both):  # mid-ranks of tied runs
        stop = start
        while stop + 1 < len(both) and sorted_scores[stop + 1] == sorted_scores[start]:
            stop += 1
        ranks[order[start:stop + 1]] = 0.5 * (start + stop) + 1.0
        start = stop + 1
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


@torch.no_grad()
def reconstructed_logits(trainer: Any, upload: Arrays) -> torch.Tensor:
    """Logits [n, C] on the client's nodes of the model the server can build from
    ``upload`` alone: the method's trainer, fresh (its seeded initial values for whatever
    is not uploaded, e.g. FedAux's masks), then ``load_payload(upload)``, then every other
    uploaded array that names one of the model's (FED-PUB's uploaded masks, which its own
    ``load_payload`` skips). FedSpray uploads only its encoder: its projector g_q
    (trained with cross-entropy on the client's labels) gives the logits."""
    from fedgraph_flwr.algorithms.fedspray import FedSprayTrainer
    from fedgraph_flwr.algorithms.supervised import SupervisedTrainer

    trainer.load_payload(upload)
    if isinstance(trainer, FedSprayTrainer):
        enc = trainer.encoder
        enc.eval()
        return enc.project(enc.embed_features(trainer.data.x))
    if not isinstance(trainer, SupervisedTrainer):
        raise ValueError(f"{type(trainer).__name__}: no membership reconstruction for this trainer")
    state = trainer.model.state_dict()
    for name, value in upload.items():
        if name in state and state[name].shape == tuple(np.shape(value)):
            state[name].copy_(torch.as_tensor(value))
    trainer.model.eval()
    return trainer.forward()


def node_losses(logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Per-node cross-entropy (BCE on one logit for binary models)."""
    if logits.size(1) == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0], y.float(), reduction="none").numpy()
    return F.cross_entropy(logits, y, reduction="none").numpy()


def membership_attack(transport: RecordingTransport, num_classes: int) -> dict[str, Any]:
    """Loss-threshold membership on each client's last train-phase upload."""
    from fedgraph_flwr.engine import client_runtime as rt

    per_client, pooled_pos, pooled_neg = [], [], []
    rnd = transport.last_round
    for cid in sorted(transport.data):
        rec = transport.records.get((rnd, "train", cid))
        if rec is None:
            continue
        data = transport.data[cid]
        trainer = rt.restore_trainer(data, num_classes, transport.configs[cid], None,
                                     transport.device, cid)
        logits = reconstructed_logits(trainer, rec.upload).cpu()
        y = trainer.data.y.cpu()
        loss = node_losses(logits, y)
        hit = ((logits[:, 0] > 0).long() if logits.size(1) == 1 else logits.argmax(1)) == y
        train, test = data.train_mask.cpu().numpy(), data.test_mask.cpu().numpy()
        pos, neg = -loss[train], -loss[test]
        pooled_pos.append(pos)
        pooled_neg.append(neg)
        per_client.append({"client": cid, "auc": round(roc_auc(pos, neg), 4),
                           "members": int(train.sum()), "non_members": int(test.sum()),
                           "member_loss": round(float(loss[train].mean()), 4),
                           "non_member_loss": round(float(loss[test].mean()), 4),
                           "member_accuracy": round(float(hit[train].float().mean()), 4),
                           "non_member_accuracy": round(float(hit[test].float().mean()), 4),
                           "reported_test_metric": round(rec.metrics.get("test_metric", np.nan), 4)})
    aucs = [c["auc"] for c in per_client]
    return {"auc_mean": float(np.nanmean(aucs)) if aucs else float("nan"),
            "auc_pooled": roc_auc(np.concatenate(pooled_pos), np.concatenate(pooled_neg))
            if per_client else float("nan"),
            "per_client": per_client}


# --- one (method, setting) ------------------------------------------------------------------
def dp_overrides(setting: str, epsilon: float) -> dict[str, Any]:
    """The run-config keys of a DP setting (none for ``off``)."""
    return {} if setting == "off" else {"dp": setting, "dp-epsilon": epsilon}


def not_run_reason(setting: str) -> str | None:
    """Why a DP setting cannot run on this version (no ``dp`` config key), else None."""
    from fedgraph_flwr.config import all_defaults

    if setting != "off" and "dp" not in all_defaults():
        return "not run: this version has no dp config key"
    return None


def client_rows(transport: RecordingTransport, num_classes: int
                ) -> tuple[list[dict], np.ndarray, list[int]]:
    """Feature groups, true label distribution and node count of every client that
    replied in the last round."""
    rnd = transport.last_round
    rows, truth, sizes = [], [], []
    for cid in sorted(transport.data):
        received = [(phase, rec) for (r, phase, c), rec in transport.records.items()
                    if r == rnd and c == cid]
        if not any(phase == "train" for phase, _ in received):
            continue
        rows.append(label_features(received, num_classes))
        truth.append(transport.label_distribution(cid, num_classes))
        sizes.append(int(transport.data[cid].num_nodes))
    return rows, np.array(truth), sizes


def run_setting(method: str, setting: str, args: argparse.Namespace,
                log=print) -> dict[str, Any]:
    """Target and shadow federations of one method and DP setting; both attacks."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="privacy-attacks-") as scratch:
        base = {"algorithm": method, "dataset": args.dataset, "rounds": args.rounds,
                "seed": args.seed, "output-dir": scratch,
                **({"data-root": args.data_root} if args.data_root else {}),
                **dp_overrides(setting, args.dp_epsilon)}
        target, _ = run_recorded({**base, "num-clients": args.num_clients, "partition": "metis"})
        num_classes = int(next(iter(target.configs.values())).num_classes_global)
        log(f"{method} {setting}: target federation done ({time.perf_counter() - t0:.0f} s)")
        membership = membership_attack(target, num_classes)
        t_rows, y_target, _ = client_rows(target, num_classes)
        shadow_rows: list[dict] = []
        shadow_y: list[np.ndarray] = []
        groups: list[int] = []
        sizes: list[int] = []
        for g, shadow in enumerate(SHADOWS):
            transport, _ = run_recorded({**base, **shadow})
            rows, y, n = client_rows(transport, num_classes)
            shadow_rows += rows
            shadow_y.append(y)
            groups += [g] * len(rows)
            sizes += n
            log(f"{method} {setting}: shadow {g + 1}/{len(SHADOWS)} {shadow} done "
                f"({time.perf_counter() - t0:.0f} s)")
    y_shadow = np.concatenate(shadow_y)
    prior = (np.array(sizes)[:, None] * y_shadow).sum(0) / sum(sizes)
    label: dict[str, Any] = {}
    for group in ("all", "weights", "signature"):
        if not t_rows[0][group].size:
            continue
        x_s = np.stack([r[group] for r in shadow_rows])
        x_t = np.stack([r[group] for r in t_rows])
        label[group] = label_attack(x_s, y_shadow, np.array(groups), x_t, y_target, prior)
        label[group]["features"] = int(x_t.shape[1])
    direct = direct_reads(target, num_classes, y_target)
    return {
        "method": method, "setting": setting,
        "dp": dp_overrides(setting, args.dp_epsilon),
        "target": {"dataset": args.dataset, "num-clients": args.num_clients, "partition": "metis",
                   "rounds": args.rounds, "seed": args.seed},
        "shadows": list(SHADOWS), "shadow_clients": len(shadow_rows),
        "prior": np.round(prior, 4).tolist(), "truth": np.round(y_target, 4).tolist(),
        "label_distribution": label, "direct_read": direct, "membership": membership,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def calibrated_sigma(method: str, epsilon: float, plan_rounds: int, num_clients: int) -> float:
    """The noise multiplier a ``dp=client`` run of ``method`` over ``plan_rounds`` rounds
    (every client every round) is calibrated to for ``epsilon`` (the engine's own rule)."""
    from fedgraph_flwr.algorithms import get_algorithm
    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.privacy_budget import PrivacyBudget

    config = resolve_config(None, {"algorithm": method, "rounds": plan_rounds,
                                   "num-clients": num_clients, "dp": "client",
                                   "dp-epsilon": epsilon})
    trainer = get_algorithm(method).trainer
    ids = list(range(num_clients))
    budget = PrivacyBudget(config, trainer, trainer.phases, lambda r: ids, ids)
    return float(budget.config.dp_noise_multiplier)


def run_sign_setting(method: str, setting: str, args: argparse.Namespace,
                     log=print) -> dict[str, Any]:
    """One round of the target federation and the classifier-sign attack on it; under dp,
    the noise of a run calibrated to ``--dp-epsilon`` over ``--plan-rounds`` rounds."""
    t0 = time.perf_counter()
    dp: dict[str, Any] = {}
    if setting != "off":
        sigma = calibrated_sigma(method, args.dp_epsilon, args.plan_rounds, args.num_clients)
        dp = {"dp": setting, "dp-noise-multiplier": sigma}
    with tempfile.TemporaryDirectory(prefix="privacy-attacks-") as scratch:
        overrides = {"algorithm": method, "dataset": args.dataset, "rounds": 1,
                     "seed": args.seed, "output-dir": scratch, "partition": "metis",
                     "num-clients": args.num_clients,
                     **({"data-root": args.data_root} if args.data_root else {}), **dp}
        target, _ = run_recorded(overrides)
    num_classes = int(next(iter(target.configs.values())).num_classes_global)
    log(f"sign {method} {setting}: one round done ({time.perf_counter() - t0:.0f} s)")
    return {"method": method, "setting": setting, "dp": dp,
            "budget": ({"epsilon": args.dp_epsilon, "rounds": args.plan_rounds}
                       if setting != "off" else None),
            "target": {"dataset": args.dataset, "num-clients": args.num_clients,
                       "partition": "metis", "rounds": 1, "seed": args.seed},
            "sign": sign_attack(target, num_classes),
            "seconds": round(time.perf_counter() - t0, 1)}


def sign_path(out: Path, method: str, setting: str, epsilon: float, plan_rounds: int) -> Path:
    suffix = "" if setting == "off" else f"-eps{epsilon:g}-over{plan_rounds}"
    return out / f"sign-{method}-dp-{setting}{suffix}.json"


def sign_table(out: Path) -> str:
    """The sign attack's block (markers included) from every ``sign-*.json`` under ``out``."""
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("sign-*.json"))]
    commands = sorted({r.get("command", "?") for r in rows})
    lines = [SIGN_BEGIN, "", *(f"`{c}`" for c in commands), "",
             "| method | setting | σ | TV, training labels | TV, all nodes | majority class named "
             "| uniform guess: TV train / all | prior guess: TV train / all, majority named |",
             "|---|---|---|---|---|---|---|---|"]
    def order(r: dict) -> tuple:
        budget = r["budget"] or {}
        return (METHODS.index(r["method"]) if r["method"] in METHODS else len(METHODS),
                r["setting"] != "off", r["setting"], budget.get("epsilon", 0),
                budget.get("rounds", 0))

    for r in sorted(rows, key=order):
        a, n = r["sign"], len(r["sign"]["clients"])
        setting = ("DP off" if r["setting"] == "off" else
                   f"dp={r['setting']}, ε={r['budget']['epsilon']:g} over "
                   f"{r['budget']['rounds']} round{'s' if r['budget']['rounds'] > 1 else ''}")
        sigma = f"{r['dp']['dp-noise-multiplier']:.4g}" if r["dp"] else "–"
        lines.append(
            f"| {r['method']} | {setting} | {sigma} | {a['tv_train']:.3f} | {a['tv_all']:.3f} | "
            f"{a['majority_hits']} of {n} | {a['uniform']['tv_train']:.3f} / "
            f"{a['uniform']['tv_all']:.3f} | {a['prior']['tv_train']:.3f} / "
            f"{a['prior']['tv_all']:.3f}, {a['prior']['majority_hits']} of {n} |")
    lines += ["", SIGN_END]
    return "\n".join(lines)


# --- the table --------------------------------------------------------------------------------
def setting_title(setting: str, epsilon: float) -> str:
    return "DP off" if setting == "off" else f"DP {setting}, ε={epsilon:g}"


def table(out: Path, methods: Sequence[str], settings: Sequence[str], epsilon: float) -> str:
    """The markdown block (markers included) from the JSONs under ``out``, headed by the
    command(s) that wrote them."""
    commands = sorted({json.loads(p.read_text()).get("command", "?") for m in methods
                       for s in settings if (p := result_path(out, m, s, epsilon)).exists()})
    head = ["method"]
    for s in settings:
        t = setting_title(s, epsilon)
        head += [f"{t}: label dist. TV (prior guess)", f"{t}: membership AUC (pooled)"]
    lines = [DOC_BEGIN, "", *(f"`{c}`" for c in commands), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in methods:
        cells = [m]
        for s in settings:
            path = result_path(out, m, s, epsilon)
            if not path.exists():
                why = not_run_reason(s) or "not run"
                cells += [why.split(":")[0], why.split(":")[0]]
                continue
            r = json.loads(path.read_text())
            lab, mia = r["label_distribution"]["all"], r["membership"]
            cells += [f"{lab['tv']:.3f} ({lab['prior_tv']:.3f})",
                      f"{mia['auc_mean']:.3f} ({mia['auc_pooled']:.3f})"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "By feature group (mean TV over the target's clients; signature-only: the "
              "signature's arrays alone; direct read: a signature array that is already a "
              "distribution, taken as the guess) and, for the membership attack, the "
              "reconstructed model's mean loss and accuracy on members (train nodes) and "
              "non-members (test nodes), per client then averaged, the clients' own reported "
              "test accuracy, and the AUC's range over clients:", "",
              "| method | setting | all features | weights only | signature only | direct read "
              "| prior guess | loss: members / non-members | accuracy: members / non-members "
              "| reported test acc. | AUC per client |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        for s in settings:
            path = result_path(out, m, s, epsilon)
            if not path.exists():
                continue
            r = json.loads(path.read_text())
            lab = r["label_distribution"]
            per = r["membership"]["per_client"]

            def tv(group: str, lab: dict = lab) -> str:
                return f"{lab[group]['tv']:.3f}" if group in lab else "–"

            direct = ", ".join(f"{v:.3f} ({k})" for k, v in r.get("direct_read", {}).items()) or "–"
            aucs = [c["auc"] for c in per]
            lines.append(
                f"| {m} | {setting_title(s, epsilon)} | {tv('all')} | {tv('weights')} | "
                f"{tv('signature')} | {direct} | {lab['all']['prior_tv']:.3f} | "
                f"{mean_of(per, 'member_loss'):.3f} / {mean_of(per, 'non_member_loss'):.3f} | "
                f"{mean_of(per, 'member_accuracy'):.3f} / {mean_of(per, 'non_member_accuracy'):.3f} | "
                f"{mean_of(per, 'reported_test_metric'):.3f} | {min(aucs):.3f}–{max(aucs):.3f} |")
    lines += ["", DOC_END]
    return "\n".join(lines)


def mean_of(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    return float(np.mean([r.get(key, np.nan) for r in rows]))


def result_path(out: Path, method: str, setting: str, epsilon: float) -> Path:
    suffix = "" if setting == "off" else f"-eps{epsilon:g}" + ("" if KEYED_NOISE else "-seeded")
    return out / f"{method}-dp-{setting}{suffix}.json"


def write_doc(doc: Path, block: str, begin: str = DOC_BEGIN, end: str = DOC_END) -> None:
    """Replace the table between the markers of ``doc`` (a new file: just the block)."""
    from fedgraph_flwr.generated import replace_block

    text = doc.read_text() if doc.exists() else "# Privacy attacks\n\n" + begin + "\n" + end + "\n"
    new = replace_block(text, begin, end, block)
    if new is None:
        raise SystemExit(f"privacy_attacks: error: {doc} lacks the markers {begin} ... {end}")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of the per-setting JSONs")
    parser.add_argument("--data-root", default="", help="run-config data-root (else FEDGRAPH_DATA_ROOT)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--settings", "--dp", nargs="+", default=list(SETTINGS), choices=SETTINGS,
                        help="DP settings (run-config dp): off | signature | client")
    parser.add_argument("--dp-epsilon", type=float, default=4.0)
    parser.add_argument("--noise", choices=("keyed", "seeded"), default="keyed",
                        help="keyed: each federation's owners hold a fresh noise key (a "
                             "deployment); seeded: the noise follows the run's seed (research "
                             "runs), so same-seed shadows share it (written *-seeded.json)")
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--num-clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the 2-core machine)")
    parser.add_argument("--doc", type=Path, default=Path("docs/results/privacy-attacks.md"))
    parser.add_argument("--table-only", action="store_true", help="only rewrite the table")
    parser.add_argument("--attack", choices=("shadow", "sign"), default="shadow",
                        help="shadow: (a) and (b), shadow federations over --rounds rounds; "
                             "sign: (c), one round, no shadows")
    parser.add_argument("--plan-rounds", type=int, default=100,
                        help="--attack sign under dp: the rounds of the run whose noise round 1 "
                             "carries (dp-epsilon spread over them)")
    args = parser.parse_args(argv)
    global KEYED_NOISE
    KEYED_NOISE = args.noise == "keyed"
    if args.rounds < 1 or args.num_clients < 2:
        parser.error("--rounds must be >= 1 and --num-clients >= 2")
    torch.set_num_threads(args.threads)
    command = "python benchmarks/privacy_attacks.py " + " ".join(
        a for a in (sys.argv[1:] if argv is None else argv) if a != "--table-only")
    if args.attack == "sign":
        return sign_main(args, command)
    if not args.table_only:
        for method in args.methods:
            for setting in args.settings:
                path = result_path(args.out, method, setting, args.dp_epsilon)
                if path.exists():
                    print(f"{method} {setting}: {path} exists, skipped")
                    continue
                why = not_run_reason(setting)
                if why:
                    print(f"{method} {setting}: {why}")
                    continue
                from fedgraph_flwr.atomic import atomic_write
                from fedgraph_flwr.config import ConfigError

                try:
                    result = run_setting(method, setting, args)
                except ConfigError as exc:  # a combination the method refuses (one line)
                    print(f"{method} {setting}: refused: {exc}")
                    continue
                result["command"] = command
                blob = json.dumps(result, indent=1).encode()
                atomic_write(path, lambda fh, b=blob: fh.write(b))
                lab, mia = result["label_distribution"]["all"], result["membership"]
                print(f"{method} {setting}: label TV {lab['tv']:.3f} (prior {lab['prior_tv']:.3f}), "
                      f"membership AUC {mia['auc_mean']:.3f} (pooled {mia['auc_pooled']:.3f}), "
                      f"{result['seconds']:.0f} s -> {path}")
    write_doc(args.doc, table(args.out, args.methods, args.settings, args.dp_epsilon))
    print(f"wrote {args.doc}")
    return 0


def sign_main(args: argparse.Namespace, command: str) -> int:
    """``--attack sign``: each (method, setting) once, resumable; then the doc's block."""
    from fedgraph_flwr.atomic import atomic_write
    from fedgraph_flwr.config import ConfigError

    if not args.table_only:
        args.out.mkdir(parents=True, exist_ok=True)
        for method in args.methods:
            for setting in args.settings:
                path = sign_path(args.out, method, setting, args.dp_epsilon, args.plan_rounds)
                if path.exists():
                    print(f"sign {method} {setting}: {path} exists, skipped")
                    continue
                try:
                    result = run_sign_setting(method, setting, args)
                except (ConfigError, ValueError) as exc:  # refused, or no classifier to read
                    print(f"sign {method} {setting}: not run: {exc}")
                    continue
                result["command"] = command
                blob = json.dumps(result, indent=1).encode()
                atomic_write(path, lambda fh, b=blob: fh.write(b))
                a = result["sign"]
                print(f"sign {method} {setting}: TV train {a['tv_train']:.3f} (uniform "
                      f"{a['uniform']['tv_train']:.3f}, prior {a['prior']['tv_train']:.3f}), "
                      f"majority {a['majority_hits']}/{len(a['clients'])} -> {path}")
    write_doc(args.doc, sign_table(args.out), SIGN_BEGIN, SIGN_END)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
