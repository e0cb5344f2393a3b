"""Flower ServerApp entry point (``serverapp`` component in pyproject.toml)."""

from fedgraph_flwr.engine.server_app import make_server_app

app = make_server_app()
