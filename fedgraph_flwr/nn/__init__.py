"""GNN layers and models (plain torch / PyG)."""
