"""The server's privacy accountant: ε(δ) of what each client has released so far.

Neighbouring relation: **replace-one**, one client's whole data replaced by any other.
The noise is added on the client (local DP), so what an adversary holding a reply must
not tell apart is this client's data against any other data the client could hold: two
replies clipped to norm C then differ by up to 2C. Each reply a scope covers
(:mod:`.scope`) is one Gaussian mechanism with noise std σ·C (σ = ``dp-noise-multiplier``)
and sensitivity 2C, i.e. noise multiplier σ/2 in dp-accounting's terms (add/remove, where
one reply's presence is the difference, does not fit local noise: the server sees who
replied). A client's guarantee after n releases is the n-fold composition, tracked with
dp-accounting's RDP accountant (Mironov 2017; the accountant TF Privacy and Opacus use);
tests/test_dp.py checks it against dp-accounting's PLD accountant (tighter, ≤ RDP). The
run's ε is the largest over its clients.

Sampling (``fraction``) is taken into account by counting: a client spends only in the
rounds it is sampled. The server picks the sample, so it knows who took part: there is
no amplification by subsampling against the server, and none is claimed.

A target ``dp-epsilon`` without a noise multiplier is met by calibrating σ to the run's
planned releases (every sampled client in every covered phase of every round); with a
noise multiplier too, the run stops before the round that would exceed it.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import dp_accounting

# RDP orders: dp-accounting's defaults extended to the large orders small ε needs.
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64))
                   + [64, 80, 96, 128, 160, 192, 256, 384, 512, 1024])


#: Replace-one: two clipped replies differ by up to this many clip norms.
SENSITIVITY_IN_CLIPS = 2.0
NEIGHBOURS = "replace-one"


class BudgetError(ValueError):
    """No noise multiplier meets the target ε (one line)."""


def release_event(noise_multiplier: float) -> dp_accounting.DpEvent:
    """One release: noise std σ·C over sensitivity 2C, a Gaussian of multiplier σ/2."""
    return dp_accounting.GaussianDpEvent(noise_multiplier / SENSITIVITY_IN_CLIPS)


@lru_cache(maxsize=4096)
def epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """ε(δ) of ``releases`` releases with noise multiplier σ (0 releases: 0)."""
    if releases <= 0:
        return 0.0
    accountant = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS))
    accountant.compose(release_event(noise_multiplier), releases)
    return float(accountant.get_epsilon(delta))


def calibrate(target_epsilon: float, releases: int, delta: float) -> float:
    """The smallest noise multiplier (to 0.1 %) whose ``releases`` compositions spend at
    most ``target_epsilon`` at ``delta``."""
    if releases <= 0:
        raise BudgetError("the run has no release to calibrate the noise to")
    try:
        sigma = dp_accounting.calibrate_dp_mechanism(
            lambda: dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS)),
            lambda s: dp_accounting.SelfComposedDpEvent(release_event(s), releases),
            target_epsilon, delta,
            dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4)
    except Exception as exc:  # noqa: BLE001 - the library's bracket errors, as one line
        raise BudgetError(f"no noise multiplier meets dp-epsilon={target_epsilon} at "
                          f"dp-delta={delta} over {releases} releases: {exc}") from None
    sigma = float(sigma)
    # Calibration's tolerance is on σ: step up until the accountant agrees.
    while epsilon(sigma, releases, delta) > target_epsilon:
        sigma *= 1.001
    return sigma


class PrivacyAccountant:
    """Counts each client's releases and answers ε(δ) for the run."""

    def __init__(self, noise_multiplier: float, delta: float, budget: float = 0.0) -> None:
        self.noise_multiplier = noise_multiplier
        self.delta = delta
        self.budget = budget  # dp-epsilon; 0: none
        self.releases: dict[int, int] = {}

    def spend(self, clients: Iterable[int]) -> None:
        """One release by each of ``clients``."""
        for cid in clients:
            self.releases[cid] = self.releases.get(cid, 0) + 1

    def epsilon(self, releases: dict[int, int] | None = None) -> float:
        """The run's ε: the largest over its clients (of ``releases`` if given)."""
        counts = self.releases if releases is None else releases
        return epsilon(self.noise_multiplier, max(counts.values(), default=0), self.delta)

    def after(self, planned: Iterable[int]) -> float:
        """ε if each of ``planned`` (a client per release, repeats allowed) released too."""
        counts = dict(self.releases)
        for cid in planned:
            counts[cid] = counts.get(cid, 0) + 1
        return self.epsilon(counts)

    def exceeds_budget(self, planned: Iterable[int]) -> float | None:
        """ε after ``planned`` when that is over ``dp-epsilon``, else None."""
        if not self.budget:
            return None
        eps = self.after(planned)
        return eps if eps > self.budget else None

    def summary(self) -> dict[str, Any]:
        """What results and progress show: ε, δ, σ, the most releases of any client and
        the neighbouring relation ε is for."""
        return {"epsilon": self.epsilon(), "delta": self.delta,
                "noise_multiplier": self.noise_multiplier,
                "releases": max(self.releases.values(), default=0), "neighbours": NEIGHBOURS}

    def state_dict(self) -> dict[str, Any]:
        """The counts, for the checkpoint."""
        return {"dp_releases": {int(c): int(n) for c, n in self.releases.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint from before DP existed has none)."""
        self.releases = {int(c): int(n) for c, n in state.get("dp_releases", {}).items()}
