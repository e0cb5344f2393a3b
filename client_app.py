"""Flower ClientApp entry point (``clientapp`` component in pyproject.toml)."""

from fedgraph_flwr.engine.client_app import make_client_app

app = make_client_app()
