"""``fedgraph-superexec`` of a hostile data owner: its ClientApps tamper with their train replies.

The run's FAB is the honest one, as the SuperLink sends it to every SuperNode; what a data
owner runs on its own machine is its own business, and this owner wraps the ClientApp
(``fedgraph_flwr/engine/client_app.py``) in one more Flower mod before its executor starts.
The real ClientApp trains on the owner's data as usual; then, before the reply leaves the
machine (tests/test_deploy.py, issue #76):

- rounds 1 to :data:`SCALED_ROUNDS`: the update ×:data:`SCALE`, upload = sent + SCALE ·
  (upload − sent), ``sent`` the arrays of the message it received (the in-process
  benchmark's ``scale-100``, benchmarks/hostile_attacks.py);
- every later round: its ``num-train`` is NaN.

``python tests/hostile_clientapp_executor.py <fedgraph-superexec flags>``. Every tampered
reply is logged (``hostile ClientApp: round R: ...``) in the executor's log.
"""

import importlib.util
import math
import sys
from pathlib import Path

from flwr.app import Message

from fedgraph_flwr.engine import client_app
from fedgraph_flwr.engine.accelerate import superexec_main
from fedgraph_flwr.engine.records import content_arrays, content_scalars, from_metric_record, reply_content

SCALE = 100.0
SCALED_ROUNDS = 3


def _attacks():
    """benchmarks/hostile_attacks.py (benchmarks/ is no package), imported once."""
    if "hostile_attacks" in sys.modules:
        return sys.modules["hostile_attacks"]
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "hostile_attacks.py"
    spec = importlib.util.spec_from_file_location("hostile_attacks", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostile_attacks"] = module
    spec.loader.exec_module(module)
    return module


def tamper(message: Message, context, call_next) -> Message:
    """The real ClientApp's reply, then the attack of this round on a train reply."""
    if message.metadata.message_type != "train":
        return call_next(message, context)
    sent = content_arrays(message.content)
    server_round = int(content_scalars(message.content, "config")["server-round"])
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    metrics, signature = from_metric_record(content_scalars(reply.content, "metrics"))
    if server_round <= SCALED_ROUNDS:
        upload = _attacks().scaled_upload(content_arrays(reply.content), sent, SCALE)
        what = f"update x{SCALE:g}"
    else:
        upload = content_arrays(reply.content)
        metrics["num-train"] = math.nan
        what = "num-train NaN"
    print(f"hostile ClientApp: round {server_round}: {what}", file=sys.stderr, flush=True)
    return Message(reply_content(upload, metrics, signature), reply_to=message)


def install() -> None:
    """Every ClientApp this process (and the ClientApps it forks) makes is the hostile one:
    the FAB's client_app.py imports make_client_app from the preloaded module at load time."""
    honest = client_app.make_client_app

    def make_hostile_client_app(mods: list | None = None):
        return honest(mods=[*(mods or []), tamper])

    client_app.make_client_app = make_hostile_client_app
    _attacks()  # in the fork server, before any ClientApp


if __name__ == "__main__":
    install()
    superexec_main(sys.argv[1:])
