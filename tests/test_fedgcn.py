"""FedGCN: the halo the partition writes, the clients' neighbour sums, the server's total
(A·X exactly), the model that reads it, and federations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_baselines import CPU, make_config
from torch_geometric.utils import to_undirected

from fedgraph_flwr.algorithms import fedgcn
from fedgraph_flwr.config import ClientSettings
from fedgraph_flwr.core.options import ConfigError
from fedgraph_flwr.core.phases import ClientUpdate
from fedgraph_flwr.data import files
from fedgraph_flwr.data import partition as P
from fedgraph_flwr.engine import client_runtime as rt
from fedgraph_flwr.engine.loop import run_federation
from fedgraph_flwr.nn.fedgcn_net import AggreGCN

from helpers import labelled_graph, round_metrics

NUM_CLASSES = 3


def test_halo_of_a_path():
    """Path 0-1-2-3-4 and a chord 3-0; the client holds {1, 2}: its halo is {0, 3}, whose
    edge 0-3 (halo–halo) is kept with 0-1 and 2-3, both directions, in local ids."""
    edge_index = to_undirected(torch.tensor([[0, 1, 2, 3, 3], [1, 2, 3, 4, 0]]))
    halo_ids, halo_edges = P.halo(edge_index, torch.tensor([1, 2]), 5)
    assert halo_ids.tolist() == [0, 3]  # local ids 2, 3
    pairs = {tuple(e) for e in halo_edges.t().tolist()}
    assert pairs == {(2, 0), (0, 2), (1, 3), (3, 1), (2, 3), (3, 2)}


def test_neighbour_sums_count_only_own_neighbours():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # own nodes 0, 1; node 2 is a halo node
    edges = to_undirected(torch.tensor([[0, 1], [1, 2]]))
    sums = fedgcn.neighbour_sums(x, edges, 3)
    assert sums.tolist() == [[0.0, 2.0], [1.0, 0.0], [0.0, 2.0]]  # node 2's x is nobody's here


def _clients(graph, k=4):
    sets = np.array_split(np.random.default_rng(0).permutation(graph.num_nodes), k)
    return [P.induced_client(graph, np.sort(s)) for s in sets]


def test_the_exchange_gives_every_client_its_rows_of_a_times_x():
    graph = labelled_graph(50, NUM_CLASSES, 6, seed=1)
    clients = _clients(graph)
    config = make_config(fedgcn.FedGCNOptions, num_layers=2)
    initial = fedgcn.FedGCNTrainer.initial_arrays(6, NUM_CLASSES, config)
    agg = fedgcn.FedGCNAggregator(config, list(range(4)), initial)
    trainers = [fedgcn.FedGCNTrainer(c, config, NUM_CLASSES, CPU) for c in clients]
    assert all(request == {} for request in agg.configure(fedgcn.SUMS, 0, list(range(4))).values())
    replies = {c: ClientUpdate(t.run_phase(fedgcn.SUMS, {}).arrays, {}, 1) for c, t in enumerate(trainers)}
    assert all(set(r.arrays) == fedgcn.PER_NODE for r in replies.values())
    agg.step(fedgcn.SUMS, 0, replies)
    requests = agg.configure(fedgcn.HALO_SUMS, 0, list(range(4)))
    src, dst = graph.edge_index
    a_x = torch.zeros_like(graph.x).index_add_(0, src, graph.x[dst])  # (A·X)[v] = Σ_{(v,u)} x_u
    for c, (client, trainer) in enumerate(zip(clients, trainers)):
        trainer.run_phase(fedgcn.HALO_SUMS, requests[c])
        comm = torch.cat((client.global_id, client.halo_global_id))
        torch.testing.assert_close(trainer.features, a_x[comm])
    agg.step(fedgcn.HALO_SUMS, 0, {})
    assert agg.total is None  # freed once delivered
    logits = trainers[0].forward()
    assert logits.shape == (clients[0].num_nodes, NUM_CLASSES)


def test_aggregcn_reads_the_sums_linearly_then_convolves():
    model = AggreGCN(4, 8, 3, num_layers=2, dropout=0.0)
    assert [type(m).__name__ for m in model.children()] == ["Linear", "ModuleList"]
    out = model(torch.randn(5, 4), torch.tensor([[0, 1], [1, 0]]))
    assert out.shape == (5, 3)
    with pytest.raises(ValueError, match="num_layers"):
        AggreGCN(4, 8, 3, num_layers=1)


def test_hops_zero_sends_nothing_and_trains_a_plain_gcn():
    graph = labelled_graph(30, NUM_CLASSES, 6, seed=2)
    client = _clients(graph, 2)[0]
    config = make_config(fedgcn.FedGCNOptions, fedgcn_hops=0)
    trainer = fedgcn.FedGCNTrainer(client, config, NUM_CLASSES, CPU)
    assert trainer.run_phase(fedgcn.SUMS, {}).arrays == {}
    assert type(trainer.model).__name__ == "GCN"
    assert trainer.forward().shape == (client.num_nodes, NUM_CLASSES)


def test_refusals_are_one_line():
    config = make_config(fedgcn.FedGCNOptions, partition="metis-overlapping")
    initial = fedgcn.FedGCNTrainer.initial_arrays(6, NUM_CLASSES, make_config(fedgcn.FedGCNOptions))
    with pytest.raises(ConfigError, match="disjoint"):
        fedgcn.FedGCNAggregator(config, [0], initial)
    graph = labelled_graph(30, NUM_CLASSES, 6, seed=2)
    client = _clients(graph, 2)[0]
    del client.halo_global_id, client.halo_edge_index
    trainer = fedgcn.FedGCNTrainer(client, make_config(fedgcn.FedGCNOptions), NUM_CLASSES, CPU)
    with pytest.raises(ValueError, match="fedgcn-hops=0"):
        trainer.run_phase(fedgcn.SUMS, {})


def test_halo_survives_the_files_only_with_global_ids(tmp_path):
    graph = labelled_graph(30, NUM_CLASSES, 6, seed=3)
    client = _clients(graph, 2)[0]
    files.save_subgraph_file(client, tmp_path / "a.npz", include_global_id=True)
    files.save_subgraph_file(client, tmp_path / "b.npz")
    kept, dropped = files.load_subgraph_file(tmp_path / "a.npz"), files.load_subgraph_file(tmp_path / "b.npz")
    assert torch.equal(kept.halo_global_id, client.halo_global_id)
    assert torch.equal(kept.halo_edge_index, client.halo_edge_index)
    assert "halo_global_id" not in dropped and "global_id" not in dropped
    arrays = files.subgraph_arrays(client, include_global_id=True)
    arrays["halo_edge_index"] = arrays["halo_edge_index"] + 1000
    with pytest.raises(files.SubgraphFileError, match="halo_edge_index"):
        files.validate_subgraph(arrays)
    del arrays["halo_edge_index"]
    with pytest.raises(files.SubgraphFileError, match="come together"):
        files.validate_subgraph(arrays)


def test_only_fedgcn_clients_get_the_halo(synthetic_root):
    identity = rt.ClientIdentity(partition_id=0, source="cache")
    for algorithm, has_halo in (("fedgcn", True), ("fedavg", False)):
        settings = ClientSettings.from_config({"algorithm": algorithm, "dataset": "SBM",
                                               "num-clients": 5, "partition": "metis",
                                               "data-root": str(synthetic_root)})
        data, _ = rt.load_client_data(identity, settings)
        assert ("halo_global_id" in data) == has_halo
        assert ("halo_edge_index" in data) == has_halo


# --- federations -------------------------------------------------------------------------------
def _run(tmp_path, synthetic_root, **extra) -> dict:
    return run_federation({
        "algorithm": "fedgcn", "dataset": "CSBM", "num-clients": 5, "rounds": 5, "hidden": 16,
        "partition": "metis", "local-epochs": 3, "lr": 0.5, "weight-decay": 5e-4,
        "data-root": str(synthetic_root), "output-dir": str(tmp_path), "verbose": False,
        **extra}, write=False)


@pytest.mark.slow
def test_federation_learns_and_state_files_keep_the_sums(tmp_path, synthetic_root):
    live = _run(tmp_path, synthetic_root, **{"run-name": "live"})
    assert live["final"]["test_at_best_val"] > 65  # two classes
    restored = _run(tmp_path, synthetic_root, **{
        "run-name": "restored", "client-state": "file",
        "client-state-dir": str(tmp_path / "state")})
    assert round_metrics(live) == round_metrics(restored)
    plain = _run(tmp_path, synthetic_root, **{"fedgcn-hops": 0})
    assert round_metrics(plain) != round_metrics(live)
