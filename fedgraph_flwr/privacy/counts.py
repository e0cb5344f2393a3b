"""What leaves a client beside its noised arrays under ``dp=client``: no exact count.

The mechanism (:mod:`.mechanism`) covers the arrays a client sends. Its handshake facts and
reply metrics are scalars outside that guarantee, and some of them are exact counts of
its data (training, validation and test nodes, edges, the pooled protocol's correct and
minority counts). Under ``dp=client`` the client therefore

- **withholds every count** (:data:`COUNTS`) from its handshake and its replies. The
  server weighs every client alike where it would weigh by training nodes (FedAvg and the
  methods that weigh like it, AdaFGL's node-weighted step 1), as DP-FedAvg does where
  counts are private; the pooled protocol (FedSpray's), which needs the counts, is absent
  from such a run's results;
- **reports its scores to two decimals** (:data:`SCORE_DECIMALS`): an exact accuracy is a
  fraction whose denominator is a count (0.31413612 = 120/382 test nodes); rounded to 0.01,
  every denominator of 100 or more fits every reported value, smaller ones only some.

Left as they are, and not under the guarantee (docs/privacy.md says so): the rounded scores
themselves, and the engine's timings and memory peak, which grow with the subgraph like the
reply's latency the server sees anyway.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Exact counts of a client's data, in its handshake facts or its reply metrics.
COUNTS = frozenset({
    "num-nodes", "num-edges", "num-train", "num-val", "num-test",  # handshake (AdaFGL: a metric)
    "val_count", "test_count", "test_correct", "minority_count", "minority_correct",
    "val_loss_sum",  # the mean validation loss times the validation count
    "state-bytes",  # the client's serialised state: per-node tensors make it a node count
})
#: What the engine adds to every reply about the process, not the data (kept as they are).
ENGINE_KEYS = ("partition-id", "dp-noise-keyed")
ENGINE_PREFIXES = ("time-", "mem-")
SCORE_DECIMALS = 2


def withheld(scope: str) -> frozenset[str]:
    """The keys a client under ``dp=scope`` never sends."""
    return COUNTS if scope == "client" else frozenset()


def handshake_facts(facts: Mapping[str, object], scope: str) -> dict[str, object]:
    """The handshake's facts without the counts ``scope`` withholds."""
    hidden = withheld(scope)
    return {k: v for k, v in facts.items() if k not in hidden}


def reply_metrics(metrics: Mapping[str, float], scope: str) -> dict[str, float]:
    """A reply's metrics as they leave under ``scope``: under ``client`` without counts and
    with the scores rounded to :data:`SCORE_DECIMALS`; otherwise as they are."""
    if scope != "client":
        return dict(metrics)
    return {k: (v if k in ENGINE_KEYS or k.startswith(ENGINE_PREFIXES)
                else round(float(v), SCORE_DECIMALS))
            for k, v in metrics.items() if k not in COUNTS}
