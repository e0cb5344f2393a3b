"""What ``dp=signature|client`` covers: the rule both sides read.

- ``client``: everything a client sends in every phase (weights, signature, a phase's
  arrays) is clipped and noised.
- ``signature``: only what the server must read in the clear to compute its mixing
  (signatures, and the arrays of phases other than train); the train phase's weights
  are left to ``secure-aggregation`` (or go in the clear, and the run says so).

A client's phase reply is one release (one Gaussian mechanism) when its scope covers
something in it: the client's mechanism (:mod:`.mechanism`) noises exactly that, and the
server's accountant (:mod:`.accountant`) counts exactly those releases.
"""

from __future__ import annotations

from ..core.bases import ClientTrainer
from ..core.phases import TRAIN, Phase

DP_SCOPES = ("off", "signature", "client")


def sends_signature(trainer: type[ClientTrainer]) -> bool:
    """Whether the trainer's train phase sends a signature (it overrides ``signature``)."""
    return trainer.signature is not ClientTrainer.signature


def covers_upload(scope: str, phase: Phase) -> bool:
    """Whether ``scope`` noises the arrays (not the signature) a client sends in ``phase``."""
    return scope == "client" or (scope == "signature" and phase.name != TRAIN)


def releases(trainer: type[ClientTrainer], scope: str, phase: Phase) -> bool:
    """Whether a reply to ``phase`` is a DP release under ``scope`` (counted by the accountant)."""
    if scope == "off":
        return False
    return covers_upload(scope, phase) or sends_signature(trainer)


def refusal(trainer: type[ClientTrainer], algorithm: str, scope: str) -> str | None:
    """Why ``algorithm`` cannot honour ``dp=scope`` (one line), or None."""
    if scope == "off":
        return None
    if trainer.per_node_arrays:
        names = ", ".join(sorted(trainer.per_node_arrays))
        return (f"dp={scope} is refused for algorithm={algorithm}: its published protocol "
                f"sends per-node arrays ({names}), among them node indices that cannot carry "
                f"noise; run it with dp=off")
    if not any(releases(trainer, scope, p) for p in trainer.phases):
        return (f"dp=signature does nothing for algorithm={algorithm}: it sends no signature, "
                f"the server reads only its weights; use dp=client")
    return None
