"""The same federation without Flower: one process, clients trained in turn.

Used to measure Flower's overhead (same client code, same aggregator, no
messaging) and by tests that need many rounds quickly. Results are identical to
the Flower simulation for the same config on CPU. It checkpoints every round and
honours ``resume`` and ``client-state=file`` exactly as the Flower apps do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config import resolve_config
from . import client_runtime as rt
from .federation import ClientReply, Federation, nbytes
from .records import signature_floats


def run_federation(
    overrides: Mapping[str, Any] | None = None,
    *,
    write: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run a whole federation in-process; return the results dict (and write files)."""
    log = log or (lambda msg: None)
    config = resolve_config(None, overrides)
    k = int(config["num-clients"])
    clients = {}
    roster = {}
    device = rt.pick_device()
    for cid in range(k):
        identity = rt.identify({"partition-id": cid, "num-partitions": k}, config)
        data, num_classes = rt.load_client_data(identity, config)
        clients[cid] = data
        roster[cid] = rt.describe(data, num_classes, identity, device)
    fed = Federation(config, roster, log=log)
    first = fed.first_round()  # 1, or after the checkpoint's last round (resume=true)
    # Client state between rounds: with client-state=file in the same per-client files as
    # the ClientApp uses; otherwise each client's trainer simply stays alive between rounds
    # (what a ClientApp restores from context.state; tests/test_engine.py checks both
    # give the same numbers for every algorithm).
    trainers: dict[int, Any] = {}
    in_files = config["client-state"] == "file"
    for server_round in range(first, int(config["rounds"]) + 1):
        t0 = time.perf_counter()
        sampled = fed.sample(server_round)
        replies: dict[int, ClientReply] = {}
        sent = {}
        waits = {}
        client_config = fed.client_config(server_round)
        for cid in sampled:
            payload = fed.payload_for(cid)
            sent[cid] = nbytes(payload)
            if in_files:
                state = rt.load_state_file(client_config, cid, server_round)
                out = rt.train_round(clients[cid], fed.num_classes, client_config, payload,
                                     state, server_round, cid, device)
                rt.save_state_file(client_config, cid, server_round, out.state)
                extra = {"state-bytes": len(out.state)}
            else:
                if cid not in trainers:
                    trainers[cid] = rt.restore_trainer(clients[cid], fed.num_classes,
                                                       client_config, None, device)
                out = rt.run_round(trainers[cid], client_config, payload, server_round, cid)
                extra = {}
            metrics = {**out.metrics, **out.timings, "partition-id": cid, **extra}
            replies[cid] = ClientReply(out.upload, out.signature, metrics,
                                       nbytes(out.upload) + 4 * signature_floats(out.signature))
            waits[cid] = time.perf_counter() - t0
        wait = time.perf_counter() - t0
        record = fed.complete_round(server_round, sampled, replies, {}, sent,
                                    times={"wait": wait}, waits=waits)
        record.times["round"] = time.perf_counter() - t0
        if write:
            fed.save_checkpoint()
        log(f"round {server_round}: mean val {100 * record.mean('val_metric'):.2f} "
            f"test {100 * record.mean('test_metric'):.2f}")
    if write:
        fed.write_results()
    return fed.results()
