"""The names both sides of the engine use, so neither imports the other.

The server side (:mod:`.federation`, :mod:`.flower_transport`) and the client side
(:mod:`.client_app`, :mod:`.client_runtime`) agree here on the error codes of a
ClientApp's failed reply, where a client's saved state sits in the run
(``client-state=file``), why a dataset cannot be loaded, and how a process's peak
memory is measured. tests/test_import_graph.py holds the two sides apart.
"""

from __future__ import annotations

import dataclasses
import resource

from ..config import ClientSettings
from ..core.phases import TRAIN, Phase
from ..core.registry import get_algorithm

# The codes of a ClientApp's error reply (client_app.py sends them, the server reads them).
ERROR_DATA = 4001  # the client's subgraph is missing, unreadable or invalid
ERROR_TRAIN = 4002  # the trainer raised
ERROR_DATA_ROOT = 4003  # the dataset is not under the client's data root (DataRootError)
ERROR_MEMORY = 4004  # memory fuller than memory-limit (MemoryGuardError): the run stops

# client-state=file: the place of a state in the run (client_runtime.py names the state
# files after it; the server tells each client where it knows its last state to be,
# ClientConfig.client_state_expected, as state_position_tag's "<round>:<place>").
TRAIN_POSITION = 1_000  # the train phase sorts after every other phase of its round


def state_position_tag(position: tuple[int, int]) -> str:
    """The ``"<round>:<place>"`` tag of a client state's place in the run."""
    return f"{position[0]}:{position[1]}"


def state_position(config: ClientSettings, server_round: int, phase: Phase | None
                   ) -> tuple[int, int]:
    """Where the state a client saves after ``phase`` of ``server_round`` sits in the run:
    (round, place in the round)."""
    if phase is None or phase.name == TRAIN:
        return server_round, TRAIN_POSITION
    phases = [p.name for p in get_algorithm(config.algorithm).trainer.phases]
    return server_round, phases.index(phase.name)


def data_root_reason(message: str, config: ClientSettings) -> str:
    """Where the dataset's files are missing and where that root came from; the server
    adds how to point the clients elsewhere (flower_transport.data_root_hint)."""
    from ..data.datasets import DATA_ROOT_HINT  # heavy: only for a failure

    first = message.splitlines()[0].split(DATA_ROOT_HINT)[0]
    return f"{first} ({config.data_root_source})"


def missing_dataset(config: ClientSettings, fetch: bool = False) -> str | None:
    """The :class:`.client_runtime.DataRootError` every client of this run would raise here
    (this process's data root and files), or None. The ServerApp of a simulation asks it
    before the handshake: its ClientApps share its environment. With ``fetch`` and
    ``download`` on, a missing dataset is downloaded first (once, saying so), so that the
    clients find it and a failed download is one line before any client starts."""
    if config.partition == "files":
        return None
    from ..data import partition  # heavy: only when asked
    from ..data.datasets import DatasetNotAvailable, fetch_dataset

    resolved = dataclasses.replace(config, data_root=str(config.data_root_path))
    why = partition.unavailable_dataset(resolved)
    if why is not None and fetch and config.download:
        where = config.download_url or "PyG's own host"
        print(f"fedgraph-flwr: dataset {config.dataset} is not under {config.data_root_path}: "
              f"downloading it once from {where} (download=false never does)", flush=True)
        try:
            fetch_dataset(config.dataset, config.data_root_path, config.download_url)
            why = partition.unavailable_dataset(resolved)
        except DatasetNotAvailable as exc:
            why = str(exc)
    if why is None:
        return None
    offline = "" if config.download else offline_fix(config)
    return f"DataRootError: {data_root_reason(why, config)}{offline}"


def offline_fix(config: ClientSettings) -> str:
    """What fixes a dataset missing under ``download=false``: the raw files put where they
    are looked for (PyG's layout), another root, or the download switched on."""
    from ..data.datasets import get_spec  # heavy: only for a failure

    folder = get_spec(config.dataset).folder
    return (f". download=false: copy the dataset's raw files (PyG's layout, as named above) "
            f"into {config.data_root_path / folder / 'raw'}/, or point data-root (or FEDGRAPH_DATA_ROOT, "
            f"set before the local SuperLink starts) at a folder that has {folder}/raw/, "
            f"or set download=true where PyG's host is reachable")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB): a simulated ClientApp's Ray actor,
    a deployment's ClientApp process, or the ServerApp."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
