"""The server's ledger of its clients' state files (``client-state=file``).

A client keeps its state between phases in a file of its own machine, named after this
run's token; the server notes where each client last saved (a reply came back) and tells
it so with its next request, so a client whose newest file is older (another machine, a
wiped folder) refuses it instead of training on less. Under ``client-state=context``
Flower carries the state and the ledger only holds the token.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..config import ClientConfig, RunConfig
from ..core.phases import Phase
from .contract import state_position, state_position_tag


class ClientStateLedger:
    """This run's state token and, per client, the (round, place) of its last saved state."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.enabled = config.client_state == "file"
        # Names this run's client state files; kept across resume.
        self.token = uuid.uuid4().hex[:12]
        self.saved_at: dict[int, tuple[int, int]] = {}

    def config_for(self, client_id: int, config: ClientConfig) -> ClientConfig:
        """``config`` with where this client's last state is, where the ledger knows it."""
        if not self.enabled or client_id not in self.saved_at:
            return config
        return config.with_round(client_state_expected=state_position_tag(self.saved_at[client_id]))

    def note(self, phase: Phase, server_round: int, replied: list[int]) -> None:
        """A client that replied to ``phase`` saved its state after it first."""
        if self.enabled:
            here = state_position(self.config, server_round, phase)
            self.saved_at.update({c: here for c in replied})

    def state_dict(self) -> dict[str, Any]:
        """The ledger's part of a checkpoint."""
        return {"state_token": self.token,
                "saved_state_at": {int(c): list(p) for c, p in self.saved_at.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.token = str(state.get("state_token", self.token))
        self.saved_at = {int(c): (int(p[0]), int(p[1]))
                         for c, p in state.get("saved_state_at", {}).items()}
