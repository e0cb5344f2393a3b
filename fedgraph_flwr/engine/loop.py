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

import torch

from ..config import RunConfig, resolve_config
from ..core.phases import Phase
from ..secure_aggregation import ensure_run_keys
from . import client_runtime as rt
from .driver import RoundDriver
from .recorder import nbytes
from .records import signature_floats
from .transport import ClientReply, ClientRequest, Exchange, Transport


class InProcessTransport(Transport):
    """Each client's data loaded once; each phase handled by the ClientApp's own handler
    (:func:`~.client_runtime.handle_phase`), the trainer kept alive between phases (what a
    ClientApp restores from ``context.state``) or restored from its state file with
    ``client-state=file``, exactly as the ClientApp does."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")  # until connect() reads the run's ``device``
        self.data: dict[int, Any] = {}
        self.num_classes: dict[int, int] = {}
        self.live = rt.LiveTrainers()
        self.files = rt.FileStateStore()

    def connect(self, config: RunConfig) -> dict[int, dict[str, Any]]:
        """Load every client's data here; return each one's handshake facts."""
        k = config.num_clients
        client = config.client_config()
        rt.check_client_keys(client)
        self.device = rt.pick_device(client.device)
        roster = {}
        for cid in range(k):
            identity = rt.identify({"partition-id": cid, "num-partitions": k}, client)
            self.data[cid], self.num_classes[cid] = rt.load_client_data(identity, client)
            roster[cid] = rt.describe(self.data[cid], self.num_classes[cid], identity, self.device,
                                      client.dp)
        return roster

    def exchange(self, phase: Phase, requests: dict[int, ClientRequest], timeout: float
                 ) -> Exchange:
        """Run ``phase`` on each requested client in turn, through the ClientApp's handler."""
        t0 = time.perf_counter()
        out = Exchange()
        for cid, request in requests.items():
            config = request.config
            store = self.files if config.client_state == "file" else self.live
            try:
                result, metrics = rt.handle_phase(config, phase, request.arrays, self.data[cid],
                                                  config.num_classes_global, cid, store,
                                                  self.device)
            except (rt.MemoryGuardError, rt.StaleClientStateError) as exc:  # a ClientApp's
                out.failures[cid] = f"{type(exc).__name__}: {exc}"  # error reply, in Flower
                continue
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
    from ..report import write_run_report

    # ckks: this process stands for every data owner, so it makes the run's key pair (the
    # server side still loads only the public half).
    config = ensure_run_keys(resolve_config(None, overrides))
    driver = RoundDriver(config, InProcessTransport(), log=log, write=write,
                         write_report=write_run_report)
    return driver.run().results()

