"""A full-batch supervised trainer that most algorithms specialise.

Subclasses provide :meth:`build_model` and, where needed, ``local_keys`` (name
fragments of parameters that never leave the client and are never overwritten
by the server), :meth:`extra_loss` (proximal or sparsity terms) and
:meth:`signature`.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.utils import to_torch_csr_tensor

from ..config import resolve_metric
from ..core.bases import state_will_follow
from ..core.phases import Arrays
from ..metrics import pooled_counts, score
from .base import ClientTrainer

if TYPE_CHECKING:
    from ..config import ClientConfig

@functools.lru_cache(maxsize=16)
def _cached_meta_model(cls: type[SupervisedTrainer], num_features: int, num_classes: int,
                       config: ClientConfig) -> nn.Module:
    """``cls.build_model`` on the meta device (shapes only, no storage), built once per
    process and shape: a ClientApp restores its trainer every round, and building the
    layers (PyG inspects each conv's signatures) cost more than copying them."""
    with torch.device("meta"):
        return cls.build_model(num_features, num_classes, config)


#: Models of released trainers (``restore_without_init``), by meta-model key and device:
#: the next restored trainer of that shape takes one instead of allocating and copying
#: (its saved state overwrites every parameter and buffer, as after ``to_empty``).
_SPARE_MODELS: dict[tuple[Any, ...], nn.Module] = {}

#: Per-graph caches some layers fill on their first forward (PyG's ``cached=True``):
#: cleared on release, so a spare model never carries another client's graph.
_GRAPH_CACHES = ("_cached_edge_index", "_cached_adj_t", "_cached_transpose")


#: A client with at least this many nodes gives a model that declares
#: ``accepts_sparse_adjacency`` a CSR adjacency instead of ``edge_index``: each layer is
#: then one sparse-dense product instead of an [E, d] message tensor, the same sums in
#: another order, about 5x faster and far smaller on a 35k-node client (issue #29).
#: FedAuxNet then also draws its dropout masks with ``torch.rand`` (``nn/fast_dropout.py``:
#: the same distribution, another random stream). Every published figure except the
#: ogbn-arxiv-size benchmark's comes from smaller clients, so none moves.
SPARSE_ADJACENCY_MIN_NODES = 4097


def evaluation_metrics(logits: torch.Tensor, data: Data, metric: str,
                       val_loss: float | None = None) -> dict[str, float]:
    """What every client reports from eval-mode logits [n, C]: mean val cross-entropy,
    the train/val/test metric, and the pooled counts of FedSpray's protocol (minority =
    not the majority class of the client's training labels).

    ``val_loss``: the trainer's own validation loss, where it is not the cross-entropy
    of ``logits`` bit for bit (FedIIH's BCE on one logit for binary tasks)."""
    if val_loss is None:
        val_loss = (
            float(F.cross_entropy(logits[data.val_mask], data.y[data.val_mask]))
            if int(data.val_mask.sum()) else float("nan")
        )
    majority = int(torch.bincount(data.y[data.train_mask]).argmax())
    return {
        "val_loss": val_loss,
        "train_metric": score(logits, data.y, data.train_mask, metric),
        "val_metric": score(logits, data.y, data.val_mask, metric),
        "test_metric": score(logits, data.y, data.test_mask, metric),
        **pooled_counts(logits, data.y, data.val_mask, data.test_mask, majority, val_loss),
    }


class SupervisedTrainer(ClientTrainer):
    """Adam on cross-entropy over the client's training nodes, full batch."""

    local_keys: tuple[str, ...] = ()
    #: Under :func:`~fedgraph_flwr.core.bases.state_follows`, allocate the model without
    #: initialising it. Only for trainers whose saved state holds every parameter and buffer
    #: of the model and whose construction draws no other random numbers (the round re-seeds
    #: before training).
    restore_without_init: bool = False

    def __init__(self, data: Data, config: ClientConfig, num_classes: int, device: torch.device) -> None:
        super().__init__(data, config, num_classes, device)
        # Same seed everywhere: every client (and the server) builds the same initial model.
        torch.manual_seed(config.seed)
        self._spare_key: tuple[Any, ...] | None = None
        if self.restore_without_init and state_will_follow():
            self._spare_key = self._model_key(data.num_features, num_classes, config, device)
            model = _SPARE_MODELS.pop(self._spare_key, None) if self._spare_key else None
            if model is None:
                model = copy.deepcopy(self._meta_model(data.num_features, num_classes, config))
                if any(m._non_persistent_buffers_set for m in model.modules()):  # in no state
                    raise RuntimeError(f"{type(self).__name__}: restore_without_init with "
                                       f"non-persistent buffers")
                model = model.to_empty(device=device)
            self.model = model
        else:
            self.model = self.build_model(data.num_features, num_classes, config).to(device)
        self.optimizer = self.build_optimizer()
        self.metric = resolve_metric(config.metric, num_classes)

    @classmethod
    def _meta_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        return _cached_meta_model(cls, num_features, num_classes, config.without_round_facts())

    @classmethod
    def _model_key(cls, num_features: int, num_classes: int, config: ClientConfig,
                   device: torch.device) -> tuple[Any, ...]:
        """What decides the model's shape: the config less the facts of the round."""
        return (cls, num_features, num_classes, str(device), config.without_round_facts())

    def release(self) -> None:
        """Keep the model for the next trainer of its shape restored in this process,
        as that trainer would get it from ``to_empty``: no gradients, no graph caches,
        training mode (its state then overwrites every parameter and buffer)."""
        if self._spare_key is None:
            return
        model, key, self._spare_key = self.model, self._spare_key, None
        del self.model  # the spare pool holds it now; this trainer is done
        model.train()
        for param in model.parameters():
            param.grad = None
        for module in model.modules():
            for cache in _GRAPH_CACHES:
                if getattr(module, cache, None) is not None:
                    setattr(module, cache, None)
        _SPARE_MODELS[key] = model

    # --- what subclasses specialise -------------------------------------------------
    @classmethod
    def build_model(cls, num_features: int, num_classes: int, config: ClientConfig) -> nn.Module:
        """The model this trainer trains; each algorithm defines it."""
        raise NotImplementedError

    def build_optimizer(self) -> torch.optim.Optimizer:
        """Adam over the model's parameters with the run's lr and weight decay."""
        return torch.optim.Adam(
            self.model.parameters(), lr=self.config.lr,
            weight_decay=self.config.weight_decay,
        )

    def forward(self) -> torch.Tensor:
        """Logits [n, C] for every node of the client."""
        return self.model(self.data.x, self.message_graph())

    def message_graph(self) -> torch.Tensor:
        """``edge_index``, or for a large client and a model that accepts one, its
        adjacency as a CSR ``adj_t`` (row = target), built once."""
        data = self.data
        if (data.num_nodes < SPARSE_ADJACENCY_MIN_NODES
                or not getattr(self.model, "accepts_sparse_adjacency", False)):
            return data.edge_index
        if getattr(self, "_adjacency", None) is None:
            with warnings.catch_warnings():  # torch: "sparse CSR support is in beta"
                warnings.simplefilter("ignore", UserWarning)
                self._adjacency = to_torch_csr_tensor(data.edge_index.flip(0),
                                                      size=(data.num_nodes, data.num_nodes))
        return self._adjacency

    def extra_loss(self) -> torch.Tensor | float:
        """Added to the cross-entropy each step (proximal, sparsity, ...)."""
        return 0.0

    def is_local(self, name: str) -> bool:
        """Whether ``name`` contains one of ``local_keys`` (never uploaded or overwritten)."""
        return any(fragment in name for fragment in self.local_keys)

    # --- ClientTrainer ----------------------------------------------------------------
    @classmethod
    def initial_arrays(cls, num_features: int, num_classes: int, config: ClientConfig) -> Arrays:
        """The shared parameters of a freshly seeded model."""
        torch.manual_seed(config.seed)
        model = cls.build_model(num_features, num_classes, config)
        return {
            k: v.detach().cpu().numpy()
            for k, v in model.state_dict().items()
            if not any(f in k for f in cls.local_keys)
        }

    def load_payload(self, arrays: Arrays) -> None:
        """Apply the server's arrays for this client (local-only keys are skipped)."""
        state = self.model.state_dict()
        for name, value in arrays.items():
            if name in state and not self.is_local(name):
                state[name].copy_(torch.as_tensor(value))

    def train(self, epochs: int) -> dict[str, float]:
        """Full-batch Adam on cross-entropy (+ :meth:`extra_loss`) over the training nodes."""
        self.model.train()
        data = self.data
        loss_value = float("nan")
        for _ in range(epochs):
            self.optimizer.zero_grad()
            logits = self.forward()
            loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
            loss = loss + self.extra_loss()
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        return {"train_loss": loss_value}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Scores of :meth:`forward`'s logits."""
        self.model.eval()
        return self.metrics_from_logits(self.forward())

    def metrics_from_logits(self, logits: torch.Tensor) -> dict[str, float]:
        """Validation and test scores of ``logits``."""
        return evaluation_metrics(logits, self.data, self.metric)

    def upload(self) -> Arrays:
        """The model's parameters less the local-only ones."""
        return {
            k: v.detach().cpu().numpy()
            for k, v in self.model.state_dict().items()
            if not self.is_local(k)
        }

    def local_state(self) -> dict[str, Any]:
        """The model's and the optimizer's state."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`local_state` returned in the previous round."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


#: When a trainer's reported metrics are taken: after its local training (the FED-PUB
#: protocol) or on the model the server sent, before training (FedGTA's and FedLit's codes).
EVALUATE_POINTS = ("after-train", "before-train")


if TYPE_CHECKING:
    _MixinBase = SupervisedTrainer  # the class it is mixed into: its options, its evaluate
else:
    _MixinBase = object


#: The local optimizers a method may offer (its ``optimizer`` option): SGD (plain in
#: :class:`ChoosesOptimizer`) or :meth:`SupervisedTrainer.build_optimizer`'s Adam.
OPTIMIZERS = ("sgd", "adam")


class ChoosesOptimizer(_MixinBase):
    """Mixin (before :class:`SupervisedTrainer` in the bases) for an algorithm whose options
    have ``optimizer`` in :data:`OPTIMIZERS`."""

    options: Any  # the algorithm's options: they have ``optimizer``

    def build_optimizer(self) -> torch.optim.Optimizer:
        """Plain SGD or Adam, with the run's lr and weight decay."""
        if self.options.optimizer == "sgd":
            return torch.optim.SGD(self.model.parameters(), lr=self.config.lr,
                                   weight_decay=self.config.weight_decay)
        return super().build_optimizer()


class EvaluatesReceivedModel(_MixinBase):
    """Mixin (before :class:`SupervisedTrainer` in the bases) for an algorithm that may report
    the model ``train`` received rather than the one it trained: when
    :meth:`scores_received_model` says so (by default ``evaluate=before-train``, one of
    :data:`EVALUATE_POINTS`), :meth:`score_received_model` at the start of ``train`` keeps
    :meth:`received_model_metrics`, and the round's ``evaluate`` returns them."""

    options: Any  # the algorithm's options: by default they have ``evaluate``
    received_metrics: dict[str, float] | None = None

    def scores_received_model(self) -> bool:
        """Whether the round's metrics describe the received model."""
        return bool(self.options.evaluate == "before-train")

    def received_model_metrics(self) -> dict[str, float]:
        """The received model's metrics: the trainer's own evaluation, by default."""
        return super().evaluate()

    def score_received_model(self) -> None:
        """Score the received model now, if the round reports it."""
        if self.scores_received_model():
            self.received_metrics = self.received_model_metrics()

    def evaluate(self) -> dict[str, float]:
        """The model after local training, or the one ``train`` received (scored when it began)."""
        if self.received_metrics is not None:
            metrics, self.received_metrics = self.received_metrics, None
            return metrics
        return self.received_model_metrics() if self.scores_received_model() else super().evaluate()
