"""Operational visibility, on real Flower simulations (Ray backend, real ClientApp/ServerApp).

One federation (FedAux: personalized payloads plus an APV signature, so both halves
of the byte count are exercised) runs 3 rounds with 3 clients. In round 2 client 1
receives a payload whose first array has the wrong shape, put there by a Flower client
mod (a message interceptor, as a corrupting transport or a server bug would): the real
trainer raises on it and the real ClientApp replies with an error. A second client mod,
outermost, writes down the array sizes of every message as the ClientApp receives and
answers it, so the byte counts in results.json are checked against the records
themselves, not against the code that computes them.
"""

from __future__ import annotations

import csv
import json
import math
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord

from fedgraph_flwr.engine import state_codec
from fedgraph_flwr.engine.client_app import ERROR_MEMORY, ERROR_TRAIN, make_client_app
from fedgraph_flwr.engine.records import INLINE, SIG, content_arrays, request_content
from fedgraph_flwr.engine.server_app import make_server_app
from fedgraph_flwr.summary import format_summary

from helpers import round_metrics, simulate

# Every test here runs Flower simulations (directly or through the failing_run fixture).
pytestmark = [pytest.mark.simulation, pytest.mark.slow]

FAIL_CLIENT, FAIL_ROUND, ROUNDS = 1, 2, 3


# --- client mods (run inside the Ray actors, so they talk to the test through files) ---
def measure_mod(folder: str):
    """Record what each train message carried in and what its reply carried out."""

    def measure(msg, ctx, call_next):
        entry = {}
        if msg.metadata.message_type == "train":
            entry = {
                "round": int(msg.content["config"]["server-round"]),
                "client": int(ctx.node_config["partition-id"]),
                "in_array_bytes": int(sum(a.nbytes for a in content_arrays(msg.content).values())),
                **_layout("in", msg.content),
            }
        reply = call_next(msg, ctx)
        if entry:
            if reply.has_error():
                entry["error_code"] = int(reply.error.code)
            else:
                out = content_arrays(reply.content)
                entry["out_array_bytes"] = int(sum(a.nbytes for a in out.values()))
                entry.update(_layout("out", reply.content))
                entry["out_signature_floats"] = int(sum(
                    len(v) for k, v in reply.content["metrics"].items() if k.startswith(SIG)))
            Path(folder, f"{uuid.uuid4().hex}.json").write_text(json.dumps(entry))
        return reply

    return measure


def _layout(side: str, content) -> dict:
    """How a message's content is laid out: its records, its Flower Arrays, and the size
    of the packed bytes that carry its arrays."""
    records = list(content.values())
    inline = [r[INLINE] for r in content.config_records.values() if INLINE in r]
    return {f"{side}_records": len(records),
            f"{side}_arrays": sum(len(r) for r in content.array_records.values()),
            f"{side}_record_bytes": len(inline[0]) if inline else int(sum(
                len(a.data) for r in content.array_records.values() for a in r.values()))}


def wrong_shape_mod(client: int, server_round: int):
    """Replace the first array of one client's payload in one round by a 2x2 array."""

    def corrupt(msg, ctx, call_next):
        if (msg.metadata.message_type == "train"
                and int(ctx.node_config["partition-id"]) == client
                and int(msg.content["config"]["server-round"]) == server_round):
            arrays = content_arrays(msg.content)
            first = next(iter(arrays))
            arrays[first] = np.zeros((2, 2), dtype=np.float32)
            config = {k: v for k, v in msg.content["config"].items() if k != INLINE}
            msg.content = request_content(arrays, ConfigRecord(config))
        return call_next(msg, ctx)

    return corrupt


def slow_mod(client: int, server_round: int, seconds: float):
    """Hold one client's train reply in one round for ``seconds``."""

    def hold(msg, ctx, call_next):
        if (msg.metadata.message_type == "train"
                and int(ctx.node_config["partition-id"]) == client
                and int(msg.content["config"]["server-round"]) == server_round):
            time.sleep(seconds)
        return call_next(msg, ctx)

    return hold


def memory_full_mod(client: int, server_round: int):
    """Make one client's memory guard see its machine as full in one round (its
    memory-limit set to a millionth), as when memory fills up mid-run."""

    def fill(msg, ctx, call_next):
        if (msg.metadata.message_type == "train"
                and int(ctx.node_config["partition-id"]) == client
                and int(msg.content["config"]["server-round"]) == server_round):
            msg.content["config"]["memory-limit"] = 1e-6
        return call_next(msg, ctx)

    return fill


def _simulate(overrides: dict, mods: list) -> None:
    simulate(make_server_app(overrides), make_client_app(mods=mods), num_supernodes=3)


def _config(synthetic_root: Path, out: Path, run_name: str, **extra) -> dict:
    cfg = {"algorithm": "fedaux", "dataset": "SBM", "num-clients": 3, "rounds": ROUNDS,
           "hidden": 16, "data-root": str(synthetic_root), "output-dir": str(out),
           "run-name": run_name, "fail-fast": False}
    cfg.update(extra)
    return cfg



@pytest.fixture(scope="module")
def failing_run(tmp_path_factory, synthetic_root):
    """The federation with client 1 failing in round 2, fail-fast=false, context state."""
    out = tmp_path_factory.mktemp("ops")
    log = out / "measured"
    log.mkdir()
    _simulate(_config(synthetic_root, out, "ctx"),
              [measure_mod(str(log)), wrong_shape_mod(FAIL_CLIENT, FAIL_ROUND)])
    results = json.loads((out / "ctx" / "results.json").read_text())
    measured = [json.loads(p.read_text()) for p in sorted(log.iterdir())]
    with open(out / "ctx" / "history.csv", newline="") as fh:
        history = list(csv.DictReader(fh))
    return {"out": out / "ctx", "results": results, "measured": measured, "history": history}


def test_failed_client_is_reported_in_its_round_and_the_run_goes_on(failing_run):
    results, history = failing_run["results"], failing_run["history"]
    assert [r["round"] for r in results["rounds"]] == [1, 2, 3]
    r1, r2, r3 = results["rounds"]
    assert r1["failures"] == {} and r3["failures"] == {}
    # Round 2's record names the logical client (partition id) and the error code.
    assert list(r2["failures"]) == [str(FAIL_CLIENT)]
    reason = r2["failures"][str(FAIL_CLIENT)]
    assert reason.startswith(f"error {ERROR_TRAIN}: RuntimeError: "), reason
    assert set(r2["clients"]) == {"0", "2"} and not r2["void"]  # min participation held
    assert set(r3["clients"]) == {"0", "1", "2"}  # the failed client is back in round 3
    assert results["final"]["failures"] == 1
    assert results["final"]["failures_by_client"] == {str(FAIL_CLIENT): 1}
    status = {(int(row["round"]), int(row["client"])): row["status"] for row in history}
    assert status[(FAIL_ROUND, FAIL_CLIENT)] == reason
    assert sum(s == "ok" for s in status.values()) == 3 * ROUNDS - 1
    # progress.json: the last round was clean, yet the failure since the start is there.
    progress = json.loads((failing_run["out"] / "progress.json").read_text())
    assert progress["last_round"]["failures"] == {}
    assert progress["failures_since_start"] == {str(FAIL_CLIENT): {
        "rounds": 1, "first_round": FAIL_ROUND, "last_round": FAIL_ROUND, "last_reason": reason}}


def test_fail_fast_stops_at_the_failed_round_with_a_clear_message(tmp_path, synthetic_root, capfd):
    cfg = _config(synthetic_root, tmp_path, "ff", **{"fail-fast": True})
    expected = (f"fail-fast: client {FAIL_CLIENT} failed in round {FAIL_ROUND} with error "
                f"{ERROR_TRAIN}: RuntimeError: ")
    with pytest.raises(RuntimeError, match=expected):
        _simulate(cfg, [wrong_shape_mod(FAIL_CLIENT, FAIL_ROUND)])
    assert f"fedgraph-flwr: error: {expected}" in capfd.readouterr().err
    # The round that stopped the run is on record; nothing ran after it.
    results = json.loads((tmp_path / "ff" / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    last = results["rounds"][-1]
    assert last["void"] and list(last["failures"]) == [str(FAIL_CLIENT)]
    assert last["failures"][str(FAIL_CLIENT)].startswith(f"error {ERROR_TRAIN}: ")
    assert results["final"]["failures"] == 1
    # The checkpoint holds round 1 only, so resume=true would redo round 2.
    assert state_codec.decode((tmp_path / "ff" / "checkpoint.pt").read_bytes())["round"] == 1


def test_fail_fast_stops_at_a_client_that_misses_the_round_timeout(tmp_path, synthetic_root):
    cfg = _config(synthetic_root, tmp_path, "ff-slow", **{"fail-fast": True, "round-timeout": 2.0})
    expected = (f"fail-fast: client {FAIL_CLIENT} sent no reply in round {FAIL_ROUND} "
                "within round-timeout=2.0 s")
    with pytest.raises(RuntimeError, match=expected):
        _simulate(cfg, [slow_mod(FAIL_CLIENT, FAIL_ROUND, 6.0)])
    results = json.loads((tmp_path / "ff-slow" / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    last = results["rounds"][-1]
    assert last["void"] and last["failures"] == {str(FAIL_CLIENT): "missing: no reply before round-timeout"}


def test_a_client_whose_memory_is_full_stops_the_run_with_one_line_even_without_fail_fast(
        tmp_path, synthetic_root):
    cfg = _config(synthetic_root, tmp_path, "oom")  # fail-fast=False
    expected = (f"memory guard: client {FAIL_CLIENT} failed in round {FAIL_ROUND} with error "
                f"{ERROR_MEMORY}: MemoryGuardError: \\d+% of this machine's [0-9.]+ GiB memory is "
                "in use, over memory-limit=1e-06")
    with pytest.raises(RuntimeError, match=expected):
        _simulate(cfg, [memory_full_mod(FAIL_CLIENT, FAIL_ROUND)])
    results = json.loads((tmp_path / "oom" / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert results["rounds"][-1]["void"]
    # Every client reports its process's peak memory each round; the server its own.
    assert all(m["mem-peak-rss-mib"] > 50 for m in results["rounds"][0]["clients"].values())
    assert results["server_peak_rss_mib"] > 50


def test_bytes_on_record_are_the_sizes_of_the_arrays_in_the_flower_messages(failing_run):
    results, measured, history = (failing_run["results"], failing_run["measured"],
                                  failing_run["history"])
    assert len(measured) == 3 * ROUNDS  # one entry per train message the clients got
    by_key = {(m["round"], m["client"]): m for m in measured}
    assert len(by_key) == len(measured)
    csv_bytes = {(int(row["round"]), int(row["client"])):
                 (int(row["bytes_sent"]), int(row["bytes_received"])) for row in history}
    signature_seen = False
    for r in results["rounds"]:
        for cid in range(3):
            m = by_key[(r["round"], cid)]
            sent = r["bytes_sent"][str(cid)]
            assert sent == m["in_array_bytes"] > 0
            # one record, the arrays packed inline in it (no Flower Array, so no Array or
            # chunk objects on a SuperLink), a little larger than the parameters it holds
            assert (m["in_records"], m["in_arrays"]) == (1, 0)
            assert sent < m["in_record_bytes"] < sent + 4096
            if "error_code" in m:
                assert (r["round"], cid) == (FAIL_ROUND, FAIL_CLIENT)
                assert m["error_code"] == ERROR_TRAIN
                assert str(cid) not in r["bytes_received"]
                assert csv_bytes[(r["round"], cid)] == (sent, 0)
                continue
            received = r["bytes_received"][str(cid)]
            assert (m["out_records"], m["out_arrays"]) == (1, 0)
            assert m["out_array_bytes"] < m["out_record_bytes"] < m["out_array_bytes"] + 4096
            assert received == m["out_array_bytes"] + 4 * m["out_signature_floats"]
            signature_seen |= m["out_signature_floats"] > 0
            assert csv_bytes[(r["round"], cid)] == (sent, received)
    assert signature_seen  # FedAux's APV travels as metrics and is counted
    final = results["final"]
    assert final["total_bytes_sent"] == sum(m["in_array_bytes"] for m in measured)
    assert final["total_bytes_received"] == sum(
        m["out_array_bytes"] + 4 * m["out_signature_floats"] for m in measured
        if "error_code" not in m)


def test_times_per_round_and_client_with_totals_and_a_plot(failing_run):
    results = failing_run["results"]
    train_total = wait_total = aggregate_total = 0.0
    for r in results["rounds"]:
        times = r["times"]
        assert set(times) >= {"round", "wait", "aggregate"}
        assert 0 < times["wait"] <= times["round"] and 0 < times["aggregate"] < times["round"]
        assert set(r["client_times"]) == {"0", "1", "2"}  # every client answered, even with an error
        for cid, t in r["client_times"].items():
            assert 0 < t["wait"] <= times["wait"]
            if cid in r["clients"]:
                assert t["train"] == r["clients"][cid]["time-train"] > 0
                train_total += t["train"]
            else:
                assert (r["round"], int(cid)) == (FAIL_ROUND, FAIL_CLIENT) and "train" not in t
        wait_total += times["wait"]
        aggregate_total += times["aggregate"]
    final = results["final"]
    assert math.isclose(final["total_time_train_s"], train_total, rel_tol=1e-12)
    assert math.isclose(final["total_time_wait_s"], wait_total, rel_tol=1e-12)
    assert math.isclose(final["total_time_aggregate_s"], aggregate_total, rel_tol=1e-12)
    assert "server wait for replies" in format_summary(results)
    with open(failing_run["out"] / "history.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert all(float(row["time_wait"]) > 0 for row in rows)
    png = failing_run["out"] / "costs.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width = matplotlib.image.imread(png).shape[:2]
    assert width > 600 and height > 250


def test_file_client_state_gives_the_same_metrics_as_context_state(failing_run, tmp_path, synthetic_root):
    """client-state=file (the same failure in round 2 included) == client-state=context."""
    state_dir = tmp_path / "state"
    _simulate(_config(synthetic_root, tmp_path, "file", **{"client-state": "file",
                                                       "client-state-dir": str(state_dir)}),
              [wrong_shape_mod(FAIL_CLIENT, FAIL_ROUND)])
    results = json.loads((tmp_path / "file" / "results.json").read_text())
    assert round_metrics(results) == round_metrics(failing_run["results"])
    assert results["rounds"][1]["failures"].keys() == {str(FAIL_CLIENT)}
    # Each client keeps its last two states; client 1 saved nothing in its failed round.
    rounds_on_disk = {}
    for p in state_dir.glob("client_*/*.pt"):
        cid, _token, rnd = p.name[:-len(".pt")].split(".")
        assert p.parent.name == cid  # each client in its own folder
        rounds_on_disk.setdefault(cid, []).append(int(rnd[1:]))
    assert {c: sorted(r) for c, r in rounds_on_disk.items()} == {
        "client_0": [2, 3], "client_1": [1, 3], "client_2": [2, 3]}
