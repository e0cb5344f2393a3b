"""The Flower ClientApp: records in, :mod:`client_runtime` does the work, records out.

Messages handled:

- ``query`` (handshake): in ``config`` the run config; out ``info``
  (ConfigRecord of scalar facts: partition-id, num-nodes, num-features, ...).
- ``train`` (the train phase) and ``train.<phase>`` (every other phase an algorithm
  declares, :mod:`fedgraph_flwr.core.bases`): in ``arrays`` (this client's
  request: its personalized payload for train) and ``config``; out ``arrays``
  (uploaded parameters) and ``metrics`` (metrics, timings, signature).

Failures reply with an error message (code below, one-line reason) instead of
raising, so the server hears of them at once rather than at the round timeout.
"""

from __future__ import annotations

import sys
import time
import traceback
from typing import TYPE_CHECKING, cast

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from ..config import ClientConfig, ConfigError
from ..core.phases import TRAIN, Phase
from ..core.registry import ALGORITHMS, get_algorithm
from ..threshold_ckks import PHASES as THRESHOLD_PHASES
from . import client_runtime as rt
from .contract import ERROR_DATA, ERROR_DATA_ROOT, ERROR_MEMORY, ERROR_TRAIN
from .records import array_to_bytes, bytes_to_array, content_arrays, content_scalars, reply_content

if TYPE_CHECKING:  # loaded with the client's data, not with this module
    from torch_geometric.data import Data

STATE_KEY = "fedgraph-state"


def _error_reply(message: Message, code: int, exc: BaseException) -> Message:
    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    # The data owner sees it in this machine's log too, not only the server. A
    # simulation's ClientApps all log into the run's one log, where the server reports
    # the failure once for all clients: said there, not once per client.
    if code == ERROR_TRAIN or not rt.in_ray_worker():
        print(f"fedgraph-flwr client error {code}: {reason}", file=sys.stderr, flush=True)
    return Message(Error(code=code, reason=reason), reply_to=message)


def _data_error_reply(message: Message, exc: BaseException) -> Message:
    """The reply to an expected data problem: one line, no traceback."""
    code = ERROR_DATA_ROOT if isinstance(exc, rt.DataRootError) else ERROR_DATA
    return _error_reply(message, code, exc)


def _config(message: Message) -> ClientConfig:
    return ClientConfig.from_config(content_scalars(message.content, "config"))


def _identity_and_data(message: Message, context: Context
                       ) -> tuple[ClientConfig, rt.ClientIdentity, Data, int]:
    config = _config(message)
    identity = rt.identify(dict(context.node_config), config)
    data, num_classes = rt.load_client_data(identity, config)
    return config, identity, data, num_classes


#: A client state larger than this (bytes) in ``client-state="context"`` gets one warning
#: per process: it travels between the SuperNode and the ClientApp with every message.
LARGE_MEMORY_STATE = 64 * 2**20
_warned_large_state = False


class ContextStateStore(rt.SerialisedStateStore):
    """``client-state=context``: the state in Flower's ``context.state`` of this node."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def load(self, config: ClientConfig, partition_id: int, phase: Phase) -> rt.StateBlob | None:
        record = self.context.state.get(STATE_KEY)
        return None if record is None else array_to_bytes(cast(Array, record["blob"]))

    def save(self, config: ClientConfig, partition_id: int, blob: bytes, phase: Phase) -> None:
        global _warned_large_state
        if len(blob) > LARGE_MEMORY_STATE and not _warned_large_state:
            _warned_large_state = True
            print(f"fedgraph-flwr: client {partition_id}'s state is {len(blob) / 2**20:.0f} MiB "
                  f'and travels with every message under client-state="context"; '
                  f'client-state="file" keeps it on this machine', file=sys.stderr, flush=True)
        self.context.state[STATE_KEY] = ArrayRecord({"blob": bytes_to_array(blob)})


def state_store(config: ClientConfig, context: Context) -> rt.StateStore:
    """Where this ClientApp keeps its state: a file of its own, or Flower's context."""
    return rt.FileStateStore() if config.client_state == "file" else ContextStateStore(context)


def handshake(message: Message, context: Context) -> Message:
    """Load (and validate) the subgraph; report scalar facts about it."""
    try:
        config, identity, data, num_classes = _identity_and_data(message, context)
        rt.check_client_keys(config, identity)
        device = rt.pick_device(config.device)
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the server
        return _data_error_reply(message, exc)
    info = rt.describe(data, num_classes, identity, device, config.dp)
    info.update(rt.ray_resources())
    return Message(RecordDict({"info": ConfigRecord(info)}), reply_to=message)


def _phase_of(message: Message, config: ClientConfig) -> Phase:
    """``train`` -> the train phase; ``train.<name>`` -> the algorithm's phase of that name."""
    _, _, name = message.metadata.message_type.partition(".")
    phases = {p.name: p for p in get_algorithm(config.algorithm).trainer.phases}
    if config.secure_aggregation == "ckks-threshold":  # the protocol's own phases
        phases.update({p.name: p for p in THRESHOLD_PHASES})
    if (name or TRAIN) not in phases:
        raise ValueError(f"algorithm {config.algorithm} has no phase {name!r}")
    return phases[name or TRAIN]


def train(message: Message, context: Context) -> Message:
    """One phase on this client: the train phase (local training on the personalized
    payload) or another phase of the algorithm's round."""
    t0 = time.perf_counter()
    try:
        rt.check_memory(_config(message))  # before loading anything
    except rt.MemoryGuardError as exc:
        return _error_reply(message, ERROR_MEMORY, exc)
    except ConfigError as exc:  # a server of another version
        return _error_reply(message, ERROR_TRAIN, exc)
    try:
        config, identity, data, _ = _identity_and_data(message, context)
    except Exception as exc:  # noqa: BLE001
        return _data_error_reply(message, exc)
    try:
        phase = _phase_of(message, config)
        arrays = content_arrays(message.content)
        out, metrics = rt.handle_phase(config, phase, arrays, data, config.num_classes_global,
                                       identity.partition_id, state_store(config, context),
                                       rt.pick_device(config.device))
    except rt.MemoryGuardError as exc:
        return _error_reply(message, ERROR_MEMORY, exc)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        return _error_reply(message, ERROR_TRAIN, exc)
    metrics["time-client"] = time.perf_counter() - t0
    return Message(reply_content(out.upload, metrics, out.signature), reply_to=message)


def make_client_app(mods: list | None = None) -> ClientApp:
    """The ClientApp every SuperNode runs; ``mods`` are Flower client mods around it."""
    app = ClientApp(mods=mods)
    app.query()(handshake)
    app.train()(train)
    # Flower routes ``train.<name>`` to the handler registered for action ``name``.
    for name in sorted(({p.name for algo in ALGORITHMS.values() for p in algo.trainer.phases}
                        | {p.name for p in THRESHOLD_PHASES}) - {TRAIN}):
        app.train(name)(train)
    return app


__all__ = ["make_client_app", "handshake", "train"]
