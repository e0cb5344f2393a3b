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
    # Client state between rounds: in memory (as Flower's per-run context.state), or in
    # the same per-client files as the ClientApp uses with client-state=file.
    states: dict[int, bytes] = {}
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
            state = (rt.load_state_file(client_config, cid, server_round) if in_files
                     else states.get(cid))
            out = rt.train_round(clients[cid], fed.num_classes, client_config, payload,
                                 state, server_round, cid, device)
            if in_files:
                rt.save_state_file(client_config, cid, server_round, out.state)
            else:
                states[cid] = out.state
            metrics = {**out.metrics, **out.timings, "partition-id": cid,
                       "state-bytes": len(out.state)}
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
