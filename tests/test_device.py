"""The ``device`` key: where a client trains, refused in one line where it cannot be had,
recorded per client, and every algorithm's model, data and optimiser state on it.

On a CUDA machine the same tests train on ``cuda``; here (no GPU) they take the same
device-aware path on the CPU and check that asking for a GPU fails fast.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn
from torch_geometric.data import Data

from fedgraph_flwr.algorithms import ALGORITHMS
from fedgraph_flwr.config import ConfigError, RunConfig, resolve_config
from fedgraph_flwr.engine import client_runtime as rt
from fedgraph_flwr.engine.driver import RoundDriver
from fedgraph_flwr.engine.loop import InProcessTransport, run_federation

from helpers import round_metrics

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "CPU", "mps0", ""])
def test_a_device_that_is_no_device_is_refused_in_one_line(value):
    with pytest.raises(ConfigError) as err:
        resolve_config(None, {"device": value})
    assert str(err.value) == (f"device={value!r} is not a valid choice: must be auto, cpu, "
                              f"cuda or cuda:N")


def test_auto_is_cuda_exactly_when_torch_sees_a_gpu():
    assert rt.pick_device("auto").type == ("cuda" if HAS_CUDA else "cpu")
    assert rt.pick_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:3"])
def test_asking_for_a_gpu_on_a_machine_without_one_fails_instead_of_training_on_the_cpu(
        value, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with pytest.raises(rt.DeviceError) as err:
        rt.pick_device(value)
    message = str(err.value)
    assert message.startswith(f"device={value} but torch {torch.__version__}")
    assert "CUDA_VISIBLE_DEVICES='2'" in message and "\n" not in message


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_a_gpu_index_past_the_visible_ones_is_refused():
    count = torch.cuda.device_count()
    with pytest.raises(rt.DeviceError, match=f"shows {count} GPU"):
        rt.pick_device(f"cuda:{count}")
    assert rt.pick_device(f"cuda:{count - 1}") == torch.device(f"cuda:{count - 1}")


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_a_run_asking_for_a_gpu_stops_at_the_handshake_in_seconds(tmp_path, synthetic_root):
    t0 = time.perf_counter()
    with pytest.raises(rt.DeviceError, match="^device=cuda but torch"):
        run_federation({"algorithm": "fedavg", "dataset": "SBM", "num-clients": 3, "rounds": 2,
                        "data-root": str(synthetic_root), "output-dir": str(tmp_path),
                        "device": "cuda"})
    assert time.perf_counter() - t0 < 30
    assert not list(tmp_path.rglob("results.json"))


def test_the_device_is_recorded_per_client_and_shown_in_the_report(tmp_path, synthetic_root):
    cfg = {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 3, "rounds": 2, "hidden": 16,
           "data-root": str(synthetic_root), "output-dir": str(tmp_path)}
    chosen = run_federation(dict(cfg, **{"run-name": "chosen", "device": DEVICE}))
    results = json.loads((tmp_path / "chosen" / "results.json").read_text())
    assert {c["device"] for c in results["clients"].values()} == {str(rt.pick_device(DEVICE))}
    assert results["config"]["device"] == DEVICE
    html = (tmp_path / "chosen" / "report.html").read_text()
    assert "<th>device</th>" in html and f"<td>{rt.pick_device(DEVICE)}</td>" in html
    if not HAS_CUDA:  # the default picks the same device, so the same numbers
        default = run_federation(dict(cfg, **{"run-name": "default"}))
        assert round_metrics(chosen) == round_metrics(default)


def test_the_device_is_a_machine_fact_not_part_of_a_run(tmp_path):
    """A grid run on a GPU is found again from a CPU machine (same folder, not stale), and
    a checkpoint resumes on another device."""
    from fedgraph_flwr.engine.checkpoint import RESUMABLE_CHANGES
    from fedgraph_flwr.experiments import run_identity, run_name, stale_keys

    base = {"algorithm": "fedavg", "dataset": "Cora", "num-clients": 3}
    assert run_name(dict(base, device="cuda:1")) == run_name(base)
    saved = resolve_config(None, dict(base, device="cuda")).to_config()
    assert stale_keys(saved, resolve_config(None, dict(base, device="cpu"))) == []
    assert run_identity(saved) == run_identity(resolve_config(None, base).to_config())
    assert "device" in RESUMABLE_CHANGES


def _tensors(obj, seen: set[int]):
    """Every tensor a trainer holds in its attributes: modules' parameters and buffers,
    optimisers' state, graphs' tensors, and tensors in dicts, lists and tuples."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():
            yield from _tensors(state, seen)
    elif isinstance(obj, Data):
        for _, value in obj:
            yield from _tensors(value, seen)
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, seen)


#: More than a few seconds each here (fedsage: its generator pre-training).
SLOW = {"fedaux", "feddep", "fediih", "fedsage", "fedspray", "adafgl", "fedlit"}
#: Tensors a trainer keeps on the CPU on purpose, by attribute name (why beside each).
#: Keys a two-round run of an algorithm needs.
SHORT = {"adafgl": {"adafgl-rounds-step1": 1, "rounds": 3}}
ON_CPU = {
    "fedtad": {"ckr"},  # its class reliability: computed once from the CPU copy, then sent
}


@pytest.mark.parametrize("algorithm", [
    pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a for a in sorted(ALGORITHMS)])
def test_every_algorithm_keeps_its_model_data_and_optimiser_on_the_clients_device(
        tmp_path, synthetic_root, algorithm):
    """Two rounds of each registered algorithm through the device-aware path (``device``
    set explicitly); then every tensor each live trainer holds is on that device."""
    cfg = resolve_config(None, {
        "algorithm": algorithm, "dataset": "SBM", "num-clients": 3, "rounds": 2, "hidden": 16,
        "data-root": str(synthetic_root), "output-dir": str(tmp_path), "device": DEVICE,
        **SHORT.get(algorithm, {})})
    transport = InProcessTransport()
    fed = RoundDriver(cfg, transport, write=False).run()
    assert all(not r.failures for r in fed.rounds), [r.failures for r in fed.rounds]
    device = rt.pick_device(DEVICE)
    assert transport.device == device and transport.live.trainers
    for cid, trainer in transport.live.trainers.items():
        seen: set[int] = set()
        wrong = []
        for name, value in vars(trainer).items():
            if name in ON_CPU.get(algorithm, set()):
                continue
            # Scalars may stay on the CPU: Adam keeps its step count there on every device.
            wrong += [(name, t.device) for t in _tensors(value, seen)
                      if t.device != device and t.dim() > 0]
        assert not wrong, f"client {cid}: {wrong[:5]}"


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_the_clientapp_answers_the_handshake_with_the_device_error(synthetic_root):
    """The ClientApp's own handshake handler, on a message as Flower delivers it: the
    reply is an error of one line, which the server reports (engine/flower_transport.py)."""
    from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict

    from fedgraph_flwr.engine.client_app import handshake
    from fedgraph_flwr.engine.contract import ERROR_DATA
    from fedgraph_flwr.engine.records import to_config_record

    config = resolve_config(None, {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 3,
                                   "data-root": str(synthetic_root), "device": "cuda:1"})
    def delivered(run: RunConfig) -> Message:  # as a SuperNode hands it to the ClientApp
        return Message(RecordDict({"config": to_config_record(run.client_config().to_config())}),
                       metadata=Metadata(run_id=1, message_id="m1", src_node_id=0, dst_node_id=1,
                                         reply_to_message_id="", group_id="handshake",
                                         created_at=time.time(), ttl=60.0, message_type="query"))

    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 3},
                      state=RecordDict(), run_config={})
    reply = handshake(delivered(config), context)
    assert reply.has_error() and reply.error.code == ERROR_DATA
    assert reply.error.reason.startswith("DeviceError: device=cuda:1 but torch")
    assert "\n" not in reply.error.reason
    cpu = resolve_config(None, {"algorithm": "fedavg", "dataset": "SBM", "num-clients": 3,
                                "data-root": str(synthetic_root), "device": "cpu"})
    info = handshake(delivered(cpu), context).content["info"]
    assert isinstance(info, ConfigRecord) and info["device"] == "cpu"
