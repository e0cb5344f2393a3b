"""The client-state codec (fedgraph_flwr.engine.state_codec) and restoring without init."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from fedgraph_flwr.algorithms import ALGORITHMS, get_algorithm
from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.core.phases import TRAIN_PHASE
from fedgraph_flwr.engine import client_runtime as rt
from fedgraph_flwr.engine import framing, state_codec


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and bool(torch.equal(a, b)))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _adam_state() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-6)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 30)).sum().backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def test_round_trip_is_exact_for_every_kind_of_leaf():
    state = {
        **_adam_state(),
        "flags": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 4),
        "half": torch.randn(5).bfloat16(),
        "ids": torch.arange(7, dtype=torch.int64).view(7, 1),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "plain": (1, 2.5, None, "x", [True, {"k": 3}]),
        7: [torch.ones(2, 2)],
    }
    blob = state_codec.encode(state)
    assert blob[:len(state_codec.MAGIC)] == state_codec.MAGIC
    assert _same(state_codec.decode(blob), state)


def test_decoded_tensors_are_writable_and_do_not_alias_the_blob():
    state = _adam_state()
    blob = state_codec.encode(state)
    before = bytes(blob)
    out = state_codec.decode(blob)
    out["model"]["0.weight"].add_(1.0)  # in-place, as an optimizer step does
    assert bytes(blob) == before
    again = state_codec.decode(blob)
    assert torch.equal(again["model"]["0.weight"], state["model"]["0.weight"])
    # a model and Adam restored from the decoded state keep training
    model = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.load_state_dict(again["model"])
    opt.load_state_dict(again["optimizer"])
    model(torch.randn(4, 30)).sum().backward()
    opt.step()
    assert int(opt.state_dict()["state"][0]["step"]) == 3


def test_reads_torch_save_blobs_of_earlier_versions():
    state = _adam_state()
    buf = io.BytesIO()
    torch.save(state, buf)
    assert _same(state_codec.decode(buf.getvalue()), state)


def test_skeleton_refuses_foreign_classes():
    evil = pickle.dumps(io.BytesIO(b"x"), protocol=5)
    blob = framing.write(state_codec.MAGIC, evil, [])
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        state_codec.decode(blob)


def _client(n: int = 60, f: int = 12, c: int = 3) -> Data:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(0, n, (200,), generator=g)
    dst = torch.randint(0, n, (200,), generator=g)
    keep = src != dst
    edge_index = torch.stack([torch.cat([src[keep], dst[keep]]), torch.cat([dst[keep], src[keep]])])
    masks = torch.zeros(3, n, dtype=torch.bool)
    masks[torch.arange(n) % 3, torch.arange(n)] = True
    return Data(x=torch.rand(n, f, generator=g), edge_index=edge_index,
                y=torch.randint(0, c, (n,), generator=g),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


def test_fedaux_restored_without_init_trains_exactly_as_a_full_build():
    """FedAux's restore_without_init: same upload, metrics and next state, bit for bit."""
    config = resolve_config({}, {"hidden": 16, "verbose": False})
    data, device = _client(), torch.device("cpu")
    trainer_cls = get_algorithm("fedaux").trainer
    assert trainer_cls.restore_without_init
    payload = trainer_cls.initial_arrays(data.num_features, 3, config)
    first = rt.phase_round(data, 3, config, TRAIN_PHASE, payload, None, 1, 0, device)

    restored = rt.phase_round(data, 3, config, TRAIN_PHASE, first.upload, first.state, 2, 0, device)
    full = trainer_cls(data, config, 3, device)  # initialised, then overwritten by the state
    full.load_local_state(rt.state_from_bytes(first.state, device))
    reference = rt.run_round(full, config, first.upload, 2, 0)
    assert restored.metrics.keys() == reference.metrics.keys()
    assert all(restored.metrics[k] == reference.metrics[k] for k in reference.metrics
               if not k.startswith("time"))
    assert all(np.array_equal(restored.upload[k], reference.upload[k]) for k in reference.upload)
    assert _same(rt.state_from_bytes(restored.state, device),
                 state_codec.decode(rt.state_to_bytes(full.local_state())))


def test_numpy_is_stored_as_tensors_and_other_objects_are_refused_when_encoding():
    out = state_codec.decode(state_codec.encode({"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                                                 "t": np.arange(6.0).reshape(2, 3).T,
                                                 "z": np.array(1.5), "s": np.float64(0.5)}))
    assert torch.equal(out["a"], torch.arange(6, dtype=torch.float32).view(2, 3))
    assert torch.equal(out["t"], torch.arange(6.0, dtype=torch.float64).view(2, 3).T)
    assert out["z"].shape == () and float(out["z"]) == 1.5  # 0-d stays 0-d
    assert out["s"] == 0.5 and type(out["s"]) is float
    with pytest.raises(TypeError, match="cannot store a BytesIO"):
        state_codec.encode({"f": io.BytesIO()})


@pytest.mark.slow
def test_a_spare_model_passes_between_clients_without_changing_a_bit():
    """A released trainer's model serves the next restored trainer in the process (the
    spare-model pool): two clients of different graphs taking turns train exactly as
    trainers built in full, so no graph cache or gradient crosses between them."""
    from fedgraph_flwr.algorithms import supervised

    config = resolve_config({}, {"hidden": 16, "verbose": False})
    device = torch.device("cpu")
    clients = [_client(), _client(n=45)]
    clients[1].x = clients[1].x.flip(0).contiguous()
    trainer_cls = get_algorithm("fedaux").trainer
    payload = trainer_cls.initial_arrays(12, 3, config)
    supervised._SPARE_MODELS.clear()
    outs = [rt.phase_round(d, 3, config, TRAIN_PHASE, payload, None, 1, i, device)
            for i, d in enumerate(clients)]
    assert not supervised._SPARE_MODELS  # built in full: nothing to hand on
    for rnd in (2, 3):
        for i, data in enumerate(clients):
            reused = len(supervised._SPARE_MODELS) == 1
            out = rt.phase_round(data, 3, config, TRAIN_PHASE, outs[i].upload, outs[i].state,
                                 rnd, i, device)
            assert reused == ((rnd, i) != (2, 0))  # the first restore allocates, then reuses
            assert len(supervised._SPARE_MODELS) == 1  # given back
            full = trainer_cls(data, config, 3, device)
            full.load_local_state(rt.state_from_bytes(outs[i].state, device))
            reference = rt.run_round(full, config, outs[i].upload, rnd, i)
            assert all(out.metrics[k] == reference.metrics[k] for k in reference.metrics
                       if not k.startswith("time"))
            assert all(np.array_equal(out.upload[k], reference.upload[k]) for k in out.upload)
            outs[i] = out


@pytest.mark.parametrize("name", sorted(n for n, a in ALGORITHMS.items()
                                     if getattr(a.trainer, "restore_without_init", False)))
@pytest.mark.slow
def test_a_released_model_looks_like_a_fresh_one_apart_from_its_values(name):
    """What ``release`` hands on carries nothing of its last client but parameter and
    buffer values (which the next state overwrites): every other attribute of every
    module is as in a model just built."""
    from fedgraph_flwr.algorithms import supervised

    config = resolve_config({}, {"algorithm": name, "hidden": 16, "verbose": False})
    trainer_cls = get_algorithm(name).trainer
    assert trainer_cls.restore_without_init
    data, device = _client(), torch.device("cpu")
    supervised._SPARE_MODELS.clear()
    payload = trainer_cls.initial_arrays(data.num_features, 3, config)
    first = rt.phase_round(data, 3, config, TRAIN_PHASE, payload, None, 1, 0, device)
    rt.phase_round(data, 3, config, TRAIN_PHASE, first.upload, first.state, 2, 0, device)
    (spare,) = supervised._SPARE_MODELS.values()
    fresh = trainer_cls(data, config, 3, device).model
    tensors = ("_parameters", "_buffers", "_modules")
    for (path, used), (_, new) in zip(spare.named_modules(), fresh.named_modules()):
        plain = {k: v for k, v in vars(used).items() if k not in tensors}
        assert plain.keys() == {k for k in vars(new) if k not in tensors}, path
        for key, value in plain.items():
            if isinstance(value, (bool, int, float, str, tuple, type(None))):
                assert value == vars(new)[key], f"{path}.{key}"
    assert all(p.grad is None for p in spare.parameters())
