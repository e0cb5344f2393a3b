"""fedgraph-preflight: a data owner's client file checked before its SuperNode starts, with
the handshake's own one-line errors; good files pass with a one-line summary."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from fedgraph_flwr import preflight
from fedgraph_flwr.data.files import load_subgraph_file, save_subgraph_file
from fedgraph_flwr.privacy.mechanism import NOISE_KEY_ENV


def _arrays(n: int = 30, d: int = 8, classes: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    src = np.arange(n - 1)
    edges = np.stack([np.r_[src, src + 1], np.r_[src + 1, src]]).astype(np.int64)
    train = np.zeros(n, bool)
    train[: n // 3] = True
    return {"x": rng.random((n, d), dtype=np.float32), "edge_index": edges,
            "y": (np.arange(n) % classes).astype(np.int64), "train_mask": train,
            "val_mask": ~train & (np.arange(n) % 2 == 0), "test_mask": ~train & (np.arange(n) % 2 == 1)}


def _write(folder, name: str = "client_2.npz", **changes) -> str:
    arrays = {**_arrays(), **changes}
    path = folder / name
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = preflight.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out.strip(), err.strip()


def test_a_good_file_passes_with_one_summary_line(tmp_path, capsys):
    path = _write(tmp_path)
    rc, out, err = _run(capsys, path, "--features", "8", "--classes", "3")
    assert rc == 0 and not err
    assert out == (f"fedgraph-preflight: {path}: client 2: 30 nodes, 58 directed edges, "
                   f"8 features, labels 0..2 of the run's 3 classes, train/val/test 10/10/10: ready")


@pytest.mark.parametrize(("changes", "argv", "expected"), [
    ({"x": np.full((30, 8), np.nan, np.float32)}, [], "x holds NaN or infinite values"),
    ({"y": np.full(30, -1, np.int64)}, [], "y holds negative labels"),
    ({"edge_index": np.array([[0, 40], [40, 0]])}, [], "outside [0, 30)"),
    ({"train_mask": np.zeros(30, bool)}, [], "no training node"),
    ({"y": np.arange(30, dtype=np.int64)}, ["--classes", "3"],
     "label 29 is outside the run's 3 classes (0..2)"),
    ({}, ["--features", "1433"], "feature width 8, but the run's dataset has 1433"),
])
def test_a_bad_file_is_one_line_and_exit_1(tmp_path, capsys, changes, argv, expected):
    path = _write(tmp_path, **changes)
    rc, out, err = _run(capsys, path, *argv)
    assert rc == 1 and not out
    assert err.startswith("fedgraph-preflight: error: ") and "\n" not in err
    assert expected in err and path in err


def test_the_errors_are_the_handshakes_own(tmp_path, capsys):
    """The same reader as the ClientApp: a file that the handshake refuses, refused here in
    the same words."""
    path = tmp_path / "client_0.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(ValueError) as handshake:
        load_subgraph_file(path)
    rc, _, err = _run(capsys, str(path))
    assert rc == 1 and str(handshake.value) in err


def test_a_file_not_named_client_i_needs_its_id(tmp_path, capsys):
    path = _write(tmp_path, "org-a.npz")
    rc, _, err = _run(capsys, path)
    assert rc == 1 and "pass --partition-id <i>" in err
    rc, out, _ = _run(capsys, path, "--partition-id", "5")
    assert rc == 0 and "client 5:" in out


def test_pt_files_pass_too(tmp_path, capsys):
    data = load_subgraph_file(_write(tmp_path))
    save_subgraph_file(data, tmp_path / "client_1.pt", fmt="pt")
    rc, out, _ = _run(capsys, str(tmp_path / "client_1.pt"))
    assert rc == 0 and "client 1: 30 nodes" in out
    assert torch.equal(load_subgraph_file(tmp_path / "client_1.pt").x, data.x)


def test_the_runs_keys_are_checked_as_at_the_handshake(tmp_path, capsys, monkeypatch):
    path = _write(tmp_path)
    monkeypatch.delenv(NOISE_KEY_ENV, raising=False)
    rc, _, err = _run(capsys, path, "--run-config", 'dp="client" dp-epsilon=4.0')
    assert rc == 1 and f"needs {NOISE_KEY_ENV}" in err
    monkeypatch.setenv(NOISE_KEY_ENV, "owner-2-secret")
    rc, out, _ = _run(capsys, path, "--run-config", 'dp="client" dp-epsilon=4.0')
    assert rc == 0 and out.endswith(": ready")
    rc, _, err = _run(capsys, path, "--run-config", 'secure-aggregation="ckks" '
                      f'ckks-secret-context="{tmp_path / "absent.ckks"}"')
    assert rc == 1 and "absent.ckks" in err
    rc, _, err = _run(capsys, path, "--run-config", "dp=")
    assert rc == 1 and "error" in err


@pytest.mark.slow
def test_the_console_command_exits_with_the_status(tmp_path):
    bad = _write(tmp_path, y=np.full(30, -1, np.int64))
    out = subprocess.run([sys.executable, "-m", "fedgraph_flwr.preflight", bad],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr


# --- the link to the SuperLink: TLS and key registration, against a real one -------------

@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    """A loopback SuperLink as deploy/README runs it (TLS, SuperNode auth; free ports, its
    own FLWR_HOME), one SuperNode key registered and one not."""
    import importlib.util
    from pathlib import Path

    deploy = Path(__file__).resolve().parents[1] / "deploy"
    spec = importlib.util.spec_from_file_location("preflight_local_cluster", deploy / "local_cluster.py")
    cluster = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cluster)
    dep = cluster.LocalDeployment(tmp_path_factory.mktemp("preflight-link"))
    try:
        dep.make_tls()
        dep.make_keys(["supernode-0", "stranger"])
        dep.start_superlink()
        dep.register("supernode-0")
        dep.cluster = cluster
        yield dep
    finally:
        dep.stop_all()


@pytest.mark.deploy
@pytest.mark.slow
def test_preflight_checks_tls_and_key_registration_against_the_superlink(superlink, tmp_path, capsys):
    import json
    import time

    dep = superlink
    ca, keys = str(dep.tls / "ca.crt"), dep.keys
    link = ["--superlink", dep.address, "--root-certificates", ca]
    t0 = time.perf_counter()
    rc, out, err = _run(capsys, _write(tmp_path), *link,
                        "--auth-supernode-private-key", str(keys / "supernode-0"))
    took = time.perf_counter() - t0
    lines = out.splitlines()
    assert rc == 0 and err == "" and len(lines) == 3, (out, err)
    assert lines[0].endswith(": ready")
    assert lines[1].startswith(f"fedgraph-preflight: TLS to {dep.address}: the SuperLink's "
                               f"certificate (for 127.0.0.1") and "is signed by the CA" in lines[1]
    assert lines[2].startswith("fedgraph-preflight: SuperNode key sha256:") and "is registered" in lines[2]

    rc, out, err = _run(capsys, *link, "--auth-supernode-private-key", str(keys / "stranger"))
    assert rc == 1 and "TLS to" in out  # the link is fine, the key is not
    assert err.startswith("fedgraph-preflight: error: FleetCheckError: the SuperLink at ")
    assert "does not know this SuperNode's public key" in err and "flwr supernode register" in err

    rc, out, err = _run(capsys, "--superlink", dep.address, "--root-certificates",
                        str(dep.node_tls / "ca.crt"))  # another CA's certificate
    assert rc == 1 and "the SuperLink's certificate is not accepted with" in err, err
    rc, out, err = _run(capsys, "--superlink", "127.0.0.1:1", "--root-certificates", ca)
    assert rc == 1 and "cannot reach the SuperLink at 127.0.0.1:1: Connection refused" in err, err
    rc, out, err = _run(capsys, *link, "--auth-supernode-private-key", str(keys / "stranger.pub"))
    assert rc == 1 and "is not an OpenSSH or PEM private key" in err, err
    # The check activated nothing: the registered node is still only registered.
    nodes = json.loads(dep.cluster.check_call(
        ["flwr", "supernode", "list", dep.cluster.L.CONNECTION, "--format", "json"], dep.env))["nodes"]
    assert [n["status"] for n in nodes] == ["registered"], nodes
    print(f"\npreflight: file + TLS + key registration in {took:.2f} s")


def test_preflight_link_flags_go_together(capsys):
    with pytest.raises(SystemExit):
        preflight.main(["--superlink", "127.0.0.1:9092"])
    assert "--superlink and --root-certificates go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        preflight.main([])
    assert "give the client file, --superlink HOST:PORT, or both" in capsys.readouterr().err
