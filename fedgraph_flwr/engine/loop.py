"""The in-process transport: the same federation without Flower, clients trained in turn.

Used by ``fedgraph-experiments``, by tests that need many rounds quickly, and to
measure Flower's overhead (same client code, same driver, no messaging). For the
same config on CPU it gives the numbers of a Flower simulation, checkpoints every
round, and honours ``resume`` and ``client-state=file`` as the Flower apps do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..algorithms.base import Phase
from ..config import RunConfig, resolve_config
from . import client_runtime as rt
from .contract import peak_rss_mib
from .driver import RoundDriver
from .federation import ClientReply, ClientRequest, nbytes
from .records import signature_floats
from .transport import Exchange, Transport


class InProcessTransport(Transport):
    """Each client's data loaded once; its trainer kept alive between phases (what a
    ClientApp restores from ``context.state``), or restored from its state file with
    ``client-state=file``, exactly as the ClientApp does."""

    def __init__(self) -> None:
        self.device = rt.pick_device()
        self.data: dict[int, Any] = {}
        self.num_classes: dict[int, int] = {}
        self.trainers: dict[int, Any] = {}

    def connect(self, config: RunConfig) -> dict[int, dict[str, Any]]:
        k = config.num_clients
        client = config.client_config()
        roster = {}
        for cid in range(k):
            identity = rt.identify({"partition-id": cid, "num-partitions": k}, client)
            self.data[cid], self.num_classes[cid] = rt.load_client_data(identity, client)
            roster[cid] = rt.describe(self.data[cid], self.num_classes[cid], identity, self.device)
        return roster

    def exchange(self, phase: Phase, requests: dict[int, ClientRequest], timeout: float
                 ) -> Exchange:
        t0 = time.perf_counter()
        out = Exchange()
        for cid, request in requests.items():
            arrays, mine = request.arrays, request.config
            server_round, num_classes = mine.server_round, mine.num_classes_global
            try:
                rt.check_memory(mine)
            except rt.MemoryGuardError as exc:
                out.failures[cid] = f"{type(exc).__name__}: {exc}"
                continue
            if mine.client_state == "file":
                try:
                    state = rt.load_state_file(mine, cid, server_round, phase)
                except rt.StaleClientStateError as exc:  # a ClientApp's error reply, in Flower
                    out.failures[cid] = f"{type(exc).__name__}: {exc}"
                    continue
                result = rt.phase_round(self.data[cid], num_classes, mine, phase, arrays,
                                        state, server_round, cid, self.device)
                rt.save_state_file(mine, cid, server_round, result.state, phase)
                extra = {"state-bytes": len(result.state)}
            else:
                if cid not in self.trainers:
                    self.trainers[cid] = rt.restore_trainer(self.data[cid], num_classes, mine,
                                                            None, self.device, cid)
                result = rt.run_phase(self.trainers[cid], mine, phase, arrays, server_round, cid)
                extra = {}
            metrics = {**result.metrics, **result.timings, "partition-id": cid,
                       "mem-peak-rss-mib": peak_rss_mib(), **extra}
            out.replies[cid] = ClientReply(result.upload, result.signature, metrics,
                                           nbytes(result.upload) + 4 * signature_floats(result.signature))
            out.waits[cid] = time.perf_counter() - t0
        return out


def run_federation(
    overrides: Mapping[str, Any] | None = None,
    *,
    write: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run a whole federation in-process; return the results dict (and write files)."""
    config = resolve_config(None, overrides)
    driver = RoundDriver(config, InProcessTransport(), log=log, write=write)
    return driver.run().results()

