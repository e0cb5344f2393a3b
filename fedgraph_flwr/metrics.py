"""Scores used by every trainer: accuracy, or ROC-AUC on the binary heterophilic sets."""

from __future__ import annotations

import numpy as np
import torch

METRICS = ("accuracy", "roc_auc")


def score(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, metric: str) -> float:
    """Score ``logits`` [n, C] against labels ``y`` [n] on the nodes in ``mask``.

    ROC-AUC uses the positive-class logit margin (sklearn on raw scores, as the
    FedIIH code); it is NaN when the masked labels hold a single class.
    """
    if int(mask.sum()) == 0:
        return float("nan")
    out, target = logits[mask], y[mask]
    if metric == "accuracy":
        return float((out.argmax(dim=-1) == target).float().mean())
    if metric == "roc_auc":
        from sklearn.metrics import roc_auc_score  # lazy: sklearn costs ~1.5 s per fresh ClientApp process

        t = target.detach().cpu().numpy()
        if len(np.unique(t)) < 2:
            return float("nan")
        margin = (out[:, 1] - out[:, 0]) if out.size(1) > 1 else out[:, 0]
        return float(roc_auc_score(t, margin.detach().cpu().numpy()))
    raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
