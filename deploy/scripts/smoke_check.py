#!/usr/bin/env python3
"""compose_smoke.sh's check of the run's results.json, and its summary lines.

    python3 deploy/scripts/smoke_check.py RESULTS ROUNDS [--kill-after-round N --kill-node I]
        [--clients 3]

Every round is there; every round after the killed client is back has all clients, no
failure and finite metrics; rounds before it came back are printed with their reasons.
The last lines: how many clients each round had (grouped: a round short of a client
is never summed into "3/3"), the last round's mean test, the seconds per round.
Exit 0, or 1 with one line saying what is wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from fedgraph_flwr.summary import clients_per_round


class SmokeFailure(AssertionError):
    """The run's results do not show what the smoke test demands (one line)."""


def check(results: dict[str, Any], rounds: int, kill_after: int = 0, killed: int = 1,
          clients: int = 3) -> list[str]:
    """The summary lines for results that pass; raises :class:`SmokeFailure` otherwise."""
    got = results["rounds"]
    if [r["round"] for r in got] != list(range(1, rounds + 1)):
        raise SmokeFailure(f"rounds {[r['round'] for r in got]}, expected 1..{rounds}")
    everyone = [str(c) for c in range(clients)]
    lines, back = [], None
    for r in got:
        if kill_after and r["round"] > kill_after and back is None:
            if str(killed) not in r["clients"]:  # the rounds it missed: recorded, with the reason
                lines.append(f"round {r['round']} without client {killed} "
                             f"({r['times']['round']:.1f} s): {r['failures']}")
                continue
            back = r["round"]
            lines.append(f"client {killed} back in round {back}, with no manual step")
        if sorted(r["clients"]) != everyone or r["failures"]:
            raise SmokeFailure(f"round {r['round']}: clients {sorted(r['clients'])}, "
                               f"failures {r['failures']}")
        if not all(math.isfinite(c["val_metric"]) for c in r["clients"].values()):
            raise SmokeFailure(f"round {r['round']}: a non-finite val metric")
    if kill_after and back is None:
        raise SmokeFailure(f"client {killed} never came back after round {kill_after}")
    last = got[-1]["clients"].values()
    per_round = [r["times"]["round"] for r in got]
    lines += [
        f"results.json: {len(got)} rounds; {clients_per_round(got)}; last mean test "
        f"{100 * sum(c['test_metric'] for c in last) / len(last):.2f}%",
        "seconds per round: " + " ".join(f"{t:.2f}" for t in per_round)
        + f" (after round 1: mean {sum(per_round[1:]) / max(1, len(per_round) - 1):.2f})",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("rounds", type=int)
    parser.add_argument("--kill-after-round", type=int, default=0)
    parser.add_argument("--kill-node", type=int, default=1)
    parser.add_argument("--clients", type=int, default=3)
    args = parser.parse_args(argv)
    with open(args.results) as fh:
        results = json.load(fh)
    try:
        lines = check(results, args.rounds, args.kill_after_round, args.kill_node, args.clients)
    except SmokeFailure as exc:
        print(f"compose_smoke.sh: error: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(f"compose_smoke: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
