"""FedStar: structure encodings on graphs small enough to walk by hand, that only the
structure branch travels and is averaged, and short runs (Cora-10 in process; a Flower
simulation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from fedgraph_flwr.algorithms.fedstar import FedStarAggregator, FedStarTrainer, is_structure
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn import fedstar_net
from fedgraph_flwr.nn.fedstar_net import (
    FedStarNet,
    degree_encoding,
    random_walk_encoding,
    structure_encoding,
)

from helpers import labelled_graph, simulation_equals_in_process

CPU = torch.device("cpu")
PATH = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # 0 - 1 - 2
# A triangle 0, 1, 2 plus node 3 hanging off 0, plus isolated node 4.
TRIANGLE_TAIL = to_undirected(torch.tensor([[0, 1, 2, 0], [1, 2, 0, 3]]))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _graph(n: int = 60, seed: int = 0) -> Data:
    return labelled_graph(n, seed=seed)


def _config(**extra) -> dict:
    return resolve_config(None, {"algorithm": "fedstar", "hidden": 16, "num-layers": 2,
                                 "dataset": "SBM", **extra})


# --- structure encodings --------------------------------------------------------------------
def test_random_walk_encoding_on_a_path():
    """M = A D⁻¹ on 0 - 1 - 2: a walk returns only after an even number of steps; from an
    end it always goes to 1 and comes back with probability 1/2, from 1 it always does."""
    rw = random_walk_encoding(PATH, 3, 4)
    expected = torch.tensor([[0, 0.5, 0, 0.5], [0, 1.0, 0, 1.0], [0, 0.5, 0, 0.5]])
    torch.testing.assert_close(rw, expected)


def test_random_walk_encoding_on_a_triangle_with_a_tail_and_an_isolated_node(monkeypatch):
    """Node 0 has degree 3 (1, 2, 3), nodes 1, 2 degree 2, node 3 degree 1, node 4 none.

    Returns to 3 in two steps: 3 -> 0 (1) -> 3 (1/3) = 1/3. To 1 in two steps:
    1 -> 0 -> 1 (1/2 · 1/3) + 1 -> 2 -> 1 (1/2 · 1/2) = 5/12. In three steps around the
    triangle: 1 -> 0 -> 2 -> 1 (1/2·1/3·1/2) + 1 -> 2 -> 0 -> 1 (1/2·1/2·1/3) = 1/6.
    Node 4 never moves: zeros.
    """
    monkeypatch.setattr(fedstar_net, "RW_CHUNK", 2)  # several blocks of columns
    rw = random_walk_encoding(TRIANGLE_TAIL, 5, 3)
    assert rw[:, 0].tolist() == [0, 0, 0, 0, 0]  # no self-loops
    assert float(rw[3, 1]) == pytest.approx(1 / 3)
    assert float(rw[1, 1]) == pytest.approx(5 / 12)
    assert float(rw[1, 2]) == pytest.approx(1 / 6)
    assert float(rw[0, 1]) == pytest.approx(1 / 3 * (1 / 2 + 1 / 2 + 1))  # via 1, 2 or 3
    assert rw[4].tolist() == [0, 0, 0]
    # The chunked walk equals the diagonal of the dense matrix powers.
    a = torch.zeros(5, 5)
    a[TRIANGLE_TAIL[0], TRIANGLE_TAIL[1]] = 1
    deg = a.sum(dim=1)
    m = a / torch.where(deg > 0, deg, torch.ones(5))[None, :]
    powers = [torch.linalg.matrix_power(m, k).diagonal() for k in (1, 2, 3)]
    torch.testing.assert_close(rw, torch.stack(powers, dim=1))


def test_degree_encoding_clamps_to_one_and_to_the_last_slot():
    # degrees 3, 2, 2, 1, 0 with 2 slots: min(max(d, 1), 2) - 1
    dg = degree_encoding(TRIANGLE_TAIL, 5, 2)
    assert dg.tolist() == [[0, 1], [0, 1], [0, 1], [1, 0], [1, 0]]
    dg = degree_encoding(TRIANGLE_TAIL, 5, 16)
    assert dg.argmax(dim=1).tolist() == [2, 1, 1, 0, 0] and dg.sum().item() == 5


def test_structure_encoding_layouts():
    both = structure_encoding(PATH, 3, 4, 3, "rw_dg")
    assert both.shape == (3, 7)
    torch.testing.assert_close(both[:, :4], random_walk_encoding(PATH, 3, 4))
    torch.testing.assert_close(both[:, 4:], degree_encoding(PATH, 3, 3))
    assert structure_encoding(PATH, 3, 4, 3, "rw").shape == (3, 4)
    assert structure_encoding(PATH, 3, 4, 3, "dg").shape == (3, 3)
    with pytest.raises(ValueError, match="kind"):
        structure_encoding(PATH, 3, kind="ones")


@pytest.mark.parametrize("conv", ["gcn", "sage", "gin"])
def test_net_shapes_and_the_structure_branch_ignores_features(conv):
    torch.manual_seed(0)
    net = FedStarNet(8, 16, 3, structure_channels=7, num_layers=2, dropout=0.0, conv=conv).eval()
    data = _graph(20)
    s = structure_encoding(data.edge_index, 20, 4, 3)
    assert net(data.x, s, data.edge_index).shape == (20, 3)
    names = [k for k, _ in net.named_parameters()]
    shared = [k for k in names if is_structure(k)]
    assert shared and all(k.startswith(("structure_embed.", "structure_convs.")) for k in shared)
    assert any(k.startswith("convs.") for k in names) and "readout.weight" in names


# --- what travels ---------------------------------------------------------------------------
def test_only_the_structure_branch_is_uploaded_and_loaded():
    cfg = _config()
    trainer = FedStarTrainer(_graph(), cfg, 3, CPU)
    initial = FedStarTrainer.initial_arrays(8, 3, cfg)
    upload = trainer.upload()
    assert upload.keys() == initial.keys()
    assert upload and all(is_structure(k) for k in upload)
    everything = trainer.model.state_dict()
    assert {k for k in everything if is_structure(k)} == set(upload)
    assert len(upload) < len(everything)
    # Training changes both branches; a payload overwrites the structure branch only.
    trainer.train(3)
    personal = {k: v.clone() for k, v in trainer.model.state_dict().items() if not is_structure(k)}
    payload = {k: np.full_like(v, 0.5) for k, v in upload.items()}
    payload["readout.weight"] = np.zeros((3, 16), np.float32)  # not FedStar's to send: ignored
    trainer.load_payload(payload)
    state = trainer.model.state_dict()
    for k in upload:
        assert torch.all(state[k] == 0.5)
    for k, v in personal.items():
        torch.testing.assert_close(state[k], v)


def test_aggregator_averages_the_structure_branch_by_training_nodes():
    cfg = _config()
    initial = FedStarTrainer.initial_arrays(8, 3, cfg)
    aggregator = FedStarAggregator(cfg, [0, 1, 2], initial)
    updates = {c: ClientUpdate({k: np.full_like(v, float(c)) for k, v in initial.items()}, {}, n)
               for c, n in ((0, 10), (1, 30))}
    result = aggregator.aggregate(1, updates)
    assert set(result.payloads) == {0, 1, 2}  # one global branch, also for client 2
    for k in initial:
        np.testing.assert_allclose(result.payloads[2][k], np.full_like(initial[k], 0.75))
        assert result.payloads[0][k].dtype == initial[k].dtype


def test_structure_encoding_is_kept_in_local_state():
    data = _graph()
    trainer = FedStarTrainer(data, _config(), 3, CPU)
    state = trainer.local_state()
    torch.testing.assert_close(state["structure"], structure_encoding(data.edge_index, 60, 16, 16))
    rebuilt = FedStarTrainer(data, _config(), 3, CPU)
    assert rebuilt._structure is None  # computed on first use only
    rebuilt.load_local_state(state)
    assert rebuilt._structure is not None
    torch.testing.assert_close(rebuilt.evaluate()["val_loss"], trainer.evaluate()["val_loss"])


# --- runs -----------------------------------------------------------------------------------
def test_cora_10_clients_short_run(tmp_path, data_root):
    """Ten rounds on Cora with 10 METIS clients: a sane accuracy, and each client's upload
    is the structure branch only (far smaller than the model)."""
    results = run_federation({
        "algorithm": "fedstar", "dataset": "Cora", "num-clients": 10, "rounds": 10,
        "hidden": 64, "num-layers": 3, "lr": 0.01, "weight-decay": 5e-4, "dropout": 0.5,
        "local-epochs": 1, "data-root": str(data_root), "output-dir": str(tmp_path),
        "verbose": False}, write=False)
    assert results["final"]["test_at_best_val"] > 60
    # structure branch: (32·64 + 64) + 3·(64·64 + 64) floats, plus framing
    floats = 32 * 64 + 64 + 3 * (64 * 64 + 64)
    sent = results["rounds"][0]["bytes_received"]
    assert all(4 * floats <= b < 4 * floats + 4096 for b in sent.values())


@pytest.mark.simulation
def test_flower_simulation_smoke_matches_inprocess(tmp_path, data_root):
    simulation_equals_in_process({"algorithm": "fedstar", "dataset": "Cora", "num-clients": 3,
                                  "rounds": 3, "hidden": 16, "data-root": str(data_root)},
                                 tmp_path, num_supernodes=3)
