#!/usr/bin/env python3
"""Exit 0 iff Flower's gRPC health service at ADDRESS answers SERVING (a healthcheck).

    python deploy/scripts/health_probe.py 127.0.0.1:9098 [--timeout 3]

``flower-superlink``, ``flower-supernode`` (and ``fedgraph-supernode``),
``flower-superexec`` (and ``fedgraph-superexec``) start that service when given
``--health-server-address`` (flwr >= 1.41; plain gRPC, no TLS, so bind it to
127.0.0.1). The compose file's healthchecks and the systemd units run this; it needs
only ``grpcio`` and ``grpcio-health-checking``, which flwr installs.
"""

from __future__ import annotations

import argparse
import sys


def probe(address: str, timeout: float) -> str:
    """The service's status name (``SERVING``, ...), or the error, in one line."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    except grpc.RpcError as err:
        return f"unreachable ({err.code().name})"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port given to --health-server-address")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = parser.parse_args(argv)
    status = probe(args.address, args.timeout)
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
