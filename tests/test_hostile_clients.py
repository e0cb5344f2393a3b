"""benchmarks/hostile_clients.py (issue #76): each attack does what it says to a reply, the
product's reply validation sees what it should, and the harness runs a tiny grid on real
Cora, resumes it and writes its tables."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import benchmark_module, contract_metrics

ha = benchmark_module("hostile_attacks")
hc = benchmark_module("hostile_clients")


def arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"conv.weight": rng.normal(size=(6, 4)).astype(np.float32),
            "conv.bias": rng.normal(size=6).astype(np.float32),
            "apv": rng.normal(size=5).astype(np.float32)}


def reply(seed: int, signature: bool = True):
    upload = arrays(seed)
    sig = {"apv": upload["apv"].copy()} if signature else {}
    return ha.reply_with(ha.ClientReply({}, {}, {}), upload=upload, signature=sig,
                         metrics=contract_metrics(**{"num-train": 40.0}))


def context(server_round: int = 1, victim=None, cid: int = 7):
    return ha.AttackContext(cid=cid, server_round=server_round, seed=0, sent=arrays(100),
                            victim=victim)


def update(r, sent) -> dict[str, np.ndarray]:
    return ha.honest_update(r, sent)


@pytest.mark.parametrize(("name", "factor"), [("scale-10", 10.0), ("scale-100", 100.0),
                                               ("sign-flip", -1.0), ("sign-flip-4", -4.0)])
def test_scaled_update_is_factor_times_the_honest_one(name, factor):
    honest, ctx = reply(1), context()
    out = ha.ATTACKS[name].mutate(honest, ctx)
    for key, delta in update(honest, ctx.sent).items():
        np.testing.assert_allclose(update(out, ctx.sent)[key], factor * delta, rtol=1e-5, atol=1e-5)
        assert out.upload[key].dtype == honest.upload[key].dtype
    assert out.signature == honest.signature and out.metrics == honest.metrics


def test_noise_replaces_the_update_with_noise_of_its_scale_deterministically():
    honest, ctx = reply(1), context()
    out = ha.ATTACKS["noise"].mutate(honest, ctx)
    again = ha.ATTACKS["noise"].mutate(honest, ctx)
    other_round = ha.ATTACKS["noise"].mutate(honest, context(server_round=2))
    big = {"w": np.random.default_rng(3).normal(size=(200, 100)).astype(np.float32)}
    big_out = ha.noise(ha.reply_with(honest, upload=big), ha.AttackContext(7, 1, 0, {}, None))
    for key in honest.upload:
        np.testing.assert_array_equal(out.upload[key], again.upload[key])
        assert not np.array_equal(out.upload[key], other_round.upload[key])
        assert not np.allclose(update(out, ctx.sent)[key], update(honest, ctx.sent)[key])
    rms = lambda a: float(np.sqrt(np.mean(a.astype(np.float64) ** 2)))  # noqa: E731
    assert rms(big_out.upload["w"]) == pytest.approx(rms(big["w"]), rel=0.02)


def test_forge_sends_ten_times_the_update_under_the_victims_signature():
    honest, victim, ctx = reply(1), reply(2), context()
    out = ha.ATTACKS["forge"].mutate(honest, ha.AttackContext(7, 1, 0, ctx.sent, victim))
    np.testing.assert_array_equal(out.signature["apv"], victim.signature["apv"])
    np.testing.assert_array_equal(out.upload["apv"], victim.signature["apv"])  # the mixed copy too
    for key in ("conv.weight", "conv.bias"):
        np.testing.assert_allclose(update(out, ctx.sent)[key], 10 * update(honest, ctx.sent)[key],
                                   rtol=1e-5, atol=1e-5)
    plain = ha.ATTACKS["forge"].mutate(reply(1, signature=False), ctx)  # no victim: scale-10
    assert plain.signature == {}


def test_num_train_and_non_finite_attacks():
    honest = reply(1)
    assert ha.ATTACKS["num-train"].mutate(honest, context()).metrics["num-train"] == 1e9
    assert honest.metrics["num-train"] == 40.0  # the honest reply is not changed in place
    odd = ha.ATTACKS["nan-array"].mutate(honest, context(1)).upload
    even = ha.ATTACKS["nan-array"].mutate(honest, context(2)).upload
    assert np.isnan(odd["apv"].flat[0]) and np.isposinf(even["apv"].flat[0])
    assert np.isfinite(honest.upload["apv"]).all()
    assert np.isnan(ha.ATTACKS["nan-num-train"].mutate(honest, context(1)).metrics["num-train"])
    assert np.isposinf(ha.ATTACKS["nan-num-train"].mutate(honest, context(2)).metrics["num-train"])


def test_oversized_and_malformed_replies_and_what_the_validator_says():
    from fedgraph_flwr.engine.replies import ReplyValidator

    honest = reply(1)
    validator = ReplyValidator(arrays(0), {"apv": honest.signature["apv"].shape},
                               {1: {"num-train": 40}}, max_array_bytes=512 * 1024 * 1024,
                               log=lambda m: None)
    assert validator.check(1, honest) is None
    big = ha.ATTACKS["oversized-array"].mutate(honest, context()).upload["conv.weight"]
    assert big.nbytes >= ha.OVERSIZED_BYTES and big.shape[1:] == (4,)
    sig = ha.ATTACKS["oversized-signature"].mutate(honest, context())
    assert sig.signature["apv"].nbytes == ha.OVERSIZED_BYTES
    assert sig.bytes_received > ha.OVERSIZED_BYTES
    assert set(ha.ATTACKS["oversized-signature"].mutate(reply(1, signature=False), context())
               .signature) == {"oversized"}
    said = {name: validator.check(1, ha.ATTACKS[name].mutate(honest, context(1)))
            for name in ("nan-array", "oversized-array", "malformed")}
    assert "NaN or Inf" in said["nan-array"]
    assert "has shape" in said["oversized-array"]
    assert "wrong array names" in said["malformed"]
    malformed = {r: ha.ATTACKS["malformed"].mutate(honest, context(r)).upload for r in (1, 2, 3)}
    assert "apv.renamed" in malformed[1] and "apv" not in malformed[1]
    assert {a.dtype for a in malformed[2].values()} == {np.dtype(np.int32)}
    assert malformed[3]["apv"].shape == (4,)
    assert "has shape" in validator.check(1, ha.reply_with(honest, upload=malformed[3]))
    assert "has dtype int32" in validator.check(1, ha.reply_with(honest, upload=malformed[2]))
    assert "signature 'apv' has shape (4194304,), expected (5,)" in validator.check(1, sig)


def test_hostile_ids_and_victim_are_the_largest_training_sets():
    roster = {c: {"num-train": n} for c, n in enumerate([41, 51, 51, 53, 44, 45, 52, 75, 43, 42])}
    assert ha.hostile_ids(roster, 1) == [7]
    assert ha.hostile_ids(roster, 3) == [3, 6, 7]
    assert ha.victim_id(roster, [7]) == 3
    assert ha.victim_id(roster, [3, 6, 7]) == 1  # 1 and 2 tie at 51: the lower id


def test_robust_specs_become_overrides():
    assert hc.parse_robust("none") == {}
    assert hc.parse_robust("krum:robust-malicious=3,robust-trim-beta=0.1") == {
        "robust": "krum", "robust-malicious": 3, "robust-trim-beta": 0.1}
    with pytest.raises(ValueError):
        hc.parse_robust("none:robust-malicious=1")


def test_the_transport_mutates_the_hostile_reply_and_flips_labels(data_root, one_torch_thread):
    from fedgraph_flwr.config import resolve_config
    from fedgraph_flwr.engine.driver import RoundDriver
    from fedgraph_flwr.engine.loop import InProcessTransport

    cell = hc.Cell("fedavg", "none", "scale-10", 1, 0, 2)
    config = resolve_config(None, cell.overrides(str(data_root), str(data_root / "out")))
    seen = []
    scale = ha.ATTACKS["scale-10"]

    def recording(r, ctx):
        out = scale.mutate(r, ctx)
        # copies: an in-process upload is a view of the live model, which trains on
        update_now = lambda x: {k: v.copy() for k, v in update(x, ctx.sent).items()}  # noqa: E731
        seen.append((ctx, update_now(r), update_now(out)))
        return out

    transport = ha.HostileTransport(ha.Attack("scale-10", scale.doc, recording), 1)
    fed = RoundDriver(config, transport, write=False).run()
    assert transport.hostile == [7] and [ctx.server_round for ctx, _, _ in seen] == [1, 2]
    for ctx, honest, attacked in seen:
        assert ctx.cid == 7
        for key, delta in honest.items():
            assert np.abs(delta).max() > 0
            np.testing.assert_allclose(attacked[key], 10 * delta, rtol=1e-5, atol=1e-7)
    assert all(7 in r.clients for r in fed.rounds)  # accepted: nothing stops a scaled update yet

    flipped = ha.HostileTransport(ha.ATTACKS["label-flip"], 3)
    flipped.connect(config)
    plain = InProcessTransport()  # loaded after the flip: the shared cache must be untouched
    plain.connect(config)
    for cid in range(10):
        data, clean = flipped.data[cid], plain.data[cid]
        train = data.train_mask
        if cid in flipped.hostile:
            assert torch.equal(data.y[train], (clean.y[train] + 1) % 7)
            assert torch.equal(data.y[~train], clean.y[~train])
        else:
            assert torch.equal(data.y, clean.y)


def test_a_tiny_grid_resumes_and_writes_its_tables(data_root, tmp_path, one_torch_thread):
    out, doc = tmp_path / "runs.jsonl", tmp_path / "robustness.md"
    argv = ["--data-root", str(data_root), "--methods", "fedavg", "--robust", "none",
            "--attacks", "scale-10", "nan-array", "--hostile", "1", "--rounds", "2",
            "--out", str(out)]
    assert hc.main(argv) == 0
    lines = [json.loads(t) for t in out.read_text().splitlines()]
    assert [(ln["attack"], ln["hostile"]) for ln in lines] == [
        ("clean", 0), ("scale-10", 1), ("nan-array", 1)]
    by = {ln["attack"]: ln for ln in lines}
    assert not any(ln["ended"] for ln in lines) and all(ln["rounds_done"] == 2 for ln in lines)
    assert by["scale-10"]["attacker_accepted"] == 2 and by["scale-10"]["hostile_ids"] == [7]
    assert by["nan-array"]["attacker_accepted"] == 0
    assert by["nan-array"]["attacker_failures"] == {"rejected: array '…' holds NaN or Inf": 2}
    assert set(by["clean"]["honest"]) == {"1", "2", "3", "4", "5"}
    assert len(by["clean"]["test_by_round"]) == 2 and len(by["scale-10"]["test_by_round"]) == 2
    assert hc.main(argv) == 0  # resumed: every run already there
    assert len(out.read_text().splitlines()) == 3
    assert hc.main(["--table", "--out", str(out), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert hc.DOC_BEGIN in text and hc.DOC_END in text
    assert "**fedavg, 1 hostile of 10**" in text and "| scale-10 |" in text
    assert "2× rejected: array '…' holds NaN or Inf" in text
    assert "| **best-val: within 2, none ended, no honest reply lost** |" in text
