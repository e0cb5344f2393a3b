"""A dataset missing from the data root is fetched once through PyG's own download.

A local HTTP server on loopback stands in for the dataset host (run-config
``download-url``: a mirror with the PyG class's file layout) and counts the requests:
concurrent fetches download each file once (a file lock), a failed download leaves no
half of the files behind and is one line, and ``download=false`` asks nothing.
"""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from fedgraph_flwr.config import resolve_config
from fedgraph_flwr.data import datasets as ds
from fedgraph_flwr.data import partition
from fedgraph_flwr.engine.contract import missing_dataset

CORA_RAW = [f"ind.cora.{n}" for n in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")]


class DatasetHost:
    """``http.server`` on 127.0.0.1 serving ``folder``; counts GETs per file, can omit one."""

    def __init__(self, folder: Path, omit: str = "") -> None:
        self.requests: Counter[str] = Counter()
        host = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                name = self.path.lstrip("/")
                host.requests[name] += 1
                if name == omit:
                    self.send_error(404)
                    return
                super().do_GET()

            def log_message(self, *args):
                pass

        handler = functools.partial(Handler, directory=str(folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> DatasetHost:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def cora_host_files(data_root) -> Path:
    return data_root / "Cora" / "raw"


def _config(root: Path, url: str, **more):
    return resolve_config({"dataset": "Cora", "num-clients": 3, "data-root": str(root),
                           "download-url": url, **more})


@pytest.mark.slow
def test_concurrent_clients_download_each_file_once(tmp_path, cora_host_files):
    """Four processes ask for Cora at once (as a simulation's ClientApps do): one downloads,
    the others wait on the lock and find the files; together they ask the host what one
    fetch alone asks (PyG's fsspec copy makes two GETs per file)."""
    root = tmp_path / "data"
    with DatasetHost(cora_host_files) as alone:
        assert ds.fetch_dataset("Cora", tmp_path / "alone", alone.url) is True
    assert set(alone.requests) == set(CORA_RAW)
    script = ("import sys; from fedgraph_flwr.data.datasets import fetch_dataset; "
              "print(fetch_dataset('Cora', sys.argv[1], sys.argv[2]))")
    with DatasetHost(cora_host_files) as host:
        procs = [subprocess.Popen([sys.executable, "-c", script, str(root), host.url],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
        outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-800:] for o in outs]
    assert sorted(o[0].strip() for o in outs) == ["False", "False", "False", "True"]
    assert host.requests == alone.requests
    for name in CORA_RAW:  # the host's bytes, in PyG's layout
        assert (root / "Cora" / "raw" / name).read_bytes() == (cora_host_files / name).read_bytes()
    assert not [p for p in root.iterdir() if p.name.startswith(".download-")]


def test_a_run_on_an_empty_data_root_downloads_then_trains_from_it(tmp_path, cora_host_files,
                                                                    capsys):
    """What the ServerApp of a simulation (and fedgraph-run) does before the handshake:
    says it downloads, downloads once; the clients then build their partition from it."""
    root = tmp_path / "data"
    with DatasetHost(cora_host_files) as host:
        config = _config(root, host.url)
        assert missing_dataset(config, fetch=True) is None
        said = capsys.readouterr().out
        assert f"dataset Cora is not under {root}: downloading it once from {host.url}" in said
        client = partition.load_client(config.client_config(), 1)
        asked = Counter(host.requests)
        assert missing_dataset(config, fetch=True) is None
    assert set(asked) == set(CORA_RAW) and host.requests == asked  # nothing asked again
    assert client.num_features == 1433 and client.num_classes_total == 7


def test_download_false_asks_nothing_and_says_so_in_one_line(tmp_path, cora_host_files):
    root = tmp_path / "data"
    with DatasetHost(cora_host_files) as host:
        config = _config(root, host.url, download=False)
        reason = missing_dataset(config, fetch=True)
        with pytest.raises(ds.DatasetNotAvailable):
            partition.load_client(config.client_config(), 0)
    assert not host.requests
    assert reason.startswith(f"DataRootError: dataset 'Cora' is not available under {root}: "
                             f"missing Cora/raw/ind.cora.x") and "\n" not in reason


def test_a_failed_download_is_one_line_and_leaves_no_partial_files(tmp_path, cora_host_files):
    root = tmp_path / "data"
    with DatasetHost(cora_host_files, omit="ind.cora.graph") as host:
        reason = missing_dataset(_config(root, host.url), fetch=True)
    assert reason is not None and "\n" not in reason
    assert "(its download through PyG failed: " in reason  # aiohttp's error, under fsspec
    assert "404" in reason and "ind.cora.graph" in reason
    assert reason.endswith("(data root from run-config data-root)")
    assert not (root / "Cora" / "raw").exists() or not any((root / "Cora" / "raw").iterdir())
    assert not [p for p in root.iterdir() if p.name.startswith(".download-")]


def test_an_unreachable_host_fails_within_seconds(tmp_path):
    """Nothing listens on the port: refused at once (offline sites: download=false)."""
    import socket
    import time

    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(ds.DatasetNotAvailable, match="its download through PyG failed: "):
        ds.fetch_dataset("Cora", tmp_path / "data", f"http://127.0.0.1:{port}")
    assert time.perf_counter() - t0 < 10


def test_a_mirror_needs_a_class_with_one_base_url(tmp_path):
    with pytest.raises(ds.DatasetNotAvailable, match="download-url cannot be used"):
        ds.fetch_dataset("Flickr", tmp_path, "http://127.0.0.1:9")
    assert ds.fetch_dataset("SBM", tmp_path) is False  # generated: nothing to fetch
