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


def pooled_counts(logits: torch.Tensor, y: torch.Tensor, val_mask: torch.Tensor,
                  test_mask: torch.Tensor, majority: int, val_loss: float) -> dict[str, float]:
    """The client's share of FedSpray's pooled (micro) figures, as scalar counts.

    Minority test nodes are those whose label is not the client's majority *training*
    class (docs/reading/fedspray.md §7). The server sums these over clients, so nothing per node
    leaves the client.
    """
    correct = logits.argmax(dim=1) == y
    minority = test_mask & (y != majority)
    minority_count = int(minority.sum())
    minority_correct = int(correct[minority].sum())
    val_count = int(val_mask.sum())
    return {
        "test_correct": float(correct[test_mask].sum()),
        "test_count": float(test_mask.sum()),
        "minority_correct": float(minority_correct),
        "minority_count": float(minority_count),
        "minority_metric": minority_correct / minority_count if minority_count else float("nan"),
        "val_loss_sum": val_loss * val_count if val_count else 0.0,
        "val_count": float(val_count),
    }
