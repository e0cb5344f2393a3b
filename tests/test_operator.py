"""An operator's view of a run (issue #82): the summary's clients per round."""

from __future__ import annotations

from fedgraph_flwr.summary import clients_per_round, format_summary


def _round(number: int, replied: list[int], sampled: list[int]) -> dict:
    return {"round": number, "sampled": sampled,
            "clients": {str(c): {"val_metric": 0.5, "test_metric": 0.5} for c in replied},
            "failures": {str(c): "no reply" for c in sampled if c not in replied}}


def test_clients_per_round_groups_rounds_alike_and_names_who_was_missing():
    rounds = [_round(r, [0, 2] if 3 <= r <= 5 else [0, 1, 2], [0, 1, 2]) for r in range(1, 9)]
    assert clients_per_round(rounds) == (
        "rounds 1-2: 3/3 clients; rounds 3-5: 2/3 clients (without 1); rounds 6-8: 3/3 clients")
    assert clients_per_round(rounds[:2]) == "3/3 clients in each of the 2 rounds"
    # sampled (fraction < 1) is the denominator, not num-clients
    sampled = [_round(1, [0, 4], [0, 4]), _round(2, [1], [1, 3])]
    assert clients_per_round(sampled) == "round 1: 2/2 clients; round 2: 1/2 clients (without 3)"


def test_the_run_summary_says_which_rounds_were_short_of_a_client():
    rounds = [_round(r, [0, 2] if r == 2 else [0, 1, 2], [0, 1, 2]) for r in (1, 2, 3)]
    results = {"config": {"algorithm": "fedavg", "dataset": "Cora", "partition": "louvain",
                          "num-clients": 3, "seed": 0},
               "clients": {}, "rounds": rounds, "wall_time_s": 1.0,
               "final": {"test_at_best_val": 50.0, "best_round": 3}}
    text = format_summary(results)
    assert ("clients per round: round 1: 3/3 clients; round 2: 2/3 clients (without 1); "
            "round 3: 3/3 clients") in text
    full = dict(results, rounds=[_round(r, [0, 1, 2], [0, 1, 2]) for r in (1, 2)])
    assert "clients per round" not in format_summary(full)
