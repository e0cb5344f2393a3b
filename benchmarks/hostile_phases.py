"""Malformed replies to the phases before train (issue #76): which ones end a run?

Each phase method (the registered algorithms with a phase before train) runs a short
in-process federation on Cora in which client 0's non-train replies are replaced by a
malformed copy before the server sees them; its own ClientApp's errors afterwards (it was
sent nothing) count as its failure, as a ClientApp's error reply does under Flower. One
line per method and mutation: ``ok`` with the failures per round, or ``ENDED`` with why.

    python benchmarks/hostile_phases.py --data-root <root with Cora/raw>
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable

import numpy as np

from fedgraph_flwr.algorithms import ALGORITHMS
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import Arrays, Phase
from fedgraph_flwr.engine.driver import RoundDriver
from fedgraph_flwr.engine.loop import InProcessTransport
from fedgraph_flwr.engine.transport import ClientReply, ClientRequest, Exchange


def _first(arrays: Arrays) -> str:
    return sorted(arrays)[0]


MUTATIONS: dict[str, Callable[[Arrays], Arrays]] = {
    "honest": lambda a: a,
    "drop-row": lambda a: {k: v[:-1] if k == _first(a) and v.ndim else v for k, v in a.items()},
    "add-col": lambda a: {k: np.concatenate([v, v[..., :1]], -1) if v.ndim >= 2 else v
                          for k, v in a.items()},
    "rename": lambda a: {(k + "_x" if k == _first(a) else k): v for k, v in a.items()},
    "empty": lambda a: {},
    "float-int": lambda a: {k: v.astype(np.float32) if v.dtype.kind in "iu" else v
                            for k, v in a.items()},
    "big-int": lambda a: {k: np.full_like(v, 2**40) if v.dtype == np.int64 else v
                          for k, v in a.items()},
}
PHASED = sorted(n for n, a in ALGORITHMS.items() if len(a.trainer.phases) > 1)


class MutatingTransport(InProcessTransport):
    """Client 0's non-train replies that carry arrays go through ``mutate``."""

    def __init__(self, mutate: Callable[[Arrays], Arrays]) -> None:
        super().__init__()
        self.mutate = mutate
        self.mutated = 0

    def exchange(self, phase: Phase, requests: dict[int, ClientRequest], timeout: float
                 ) -> Exchange:
        out = super().exchange(phase, {c: r for c, r in requests.items() if c != 0}, timeout)
        if 0 not in requests:
            return out
        try:
            own = super().exchange(phase, {0: requests[0]}, timeout)
        except Exception as exc:  # noqa: BLE001 - the hostile ClientApp's own error
            out.failures[0] = f"its own {type(exc).__name__}"
            return out
        out.failures.update(own.failures)
        reply = own.replies.get(0)
        if reply is not None and phase.name != "train" and reply.upload:
            reply = ClientReply(self.mutate(dict(reply.upload)), reply.signature,
                                reply.metrics, reply.bytes_received)
            self.mutated += 1
        if reply is not None:
            out.replies[0] = reply
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="a writable root holding Cora/raw")
    parser.add_argument("--methods", nargs="+", default=PHASED, choices=PHASED)
    parser.add_argument("--mutations", nargs="+", default=list(MUTATIONS), choices=list(MUTATIONS))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for method in args.methods:
        for name in args.mutations:
            with tempfile.TemporaryDirectory() as tmp:
                config = resolve_config(None, {
                    "algorithm": method, "num-clients": 3, "hidden": 16, "rounds": args.rounds,
                    "dataset": "Cora", "data-root": args.data_root, "output-dir": tmp,
                    **({"adafgl-rounds-step1": 1} if method == "adafgl" else {})})
                transport = MutatingTransport(MUTATIONS[name])
                driver = RoundDriver(config, transport, log=lambda *a: None, write=False)
                try:
                    driver.run()
                except Exception as exc:  # noqa: BLE001 - a run that ends is the result
                    print(f"{method} {name}: ENDED after {transport.mutated} mutated replies: "
                          f"{type(exc).__name__}: {str(exc)[:160]}", flush=True)
                    continue
                fed = driver.federation
                assert fed is not None
                failed = {i: dict(r.failures) for i, r in enumerate(fed.rounds, 1) if r.failures}
                print(f"{method} {name}: ok, {transport.mutated} mutated replies; failures by "
                      f"round: {str(failed)[:160]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
