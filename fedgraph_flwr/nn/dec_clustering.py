"""Deep Embedded Clustering on a stacked denoising autoencoder (Xie et al., ICML 2016), as
FedDEP's codes run it (vendored ``pt-dec``: ``gfl/feddep/dec_cluster/``, OpenFGL's copy).

1. SDAE with dims [e, 128, 512, 128, e]: encoder Linear+ReLU units, the last without ReLU;
   the mirrored decoder likewise (no final activation); Xavier-uniform weights with gain
   √2, zero biases.
2. Layer-wise pre-training: sub-autoencoder i (ReLU unless last; dropout ``corruption`` on
   its code unless last) trained on MSE reconstruction of layer i's input, SGD(0.1,
   momentum 0.9), then copied in; its eval-mode code feeds the next.
3. Fine-tuning of the whole SDAE on MSE(SDAE(dropout(x, corruption)), x), SGD(0.01, 0.9).
4. DEC: centres from k-means (``n_init`` 20) on the encoder's output; then per batch the
   Student-t soft assignment q (α = 1), its sharpened target p = (q²/Σ_batch q) / row sum,
   loss KL(p ‖ q) summed over the batch / batch size, SGD(0.01, 0.9) on the encoder and the
   centres; stop early when fewer than 1e-6 of the labels change in an epoch.
5. Clusters: argmax q.

Both schedulers are StepLR(100, 0.1) stepped at each epoch's start, so they act from epoch
99 on. Batches are shuffled with the global torch RNG; k-means is seeded from it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.cluster import KMeans
from torch import nn


def _init(linear: nn.Linear) -> nn.Linear:
    nn.init.xavier_uniform_(linear.weight, math.sqrt(2.0))
    nn.init.zeros_(linear.bias)
    return linear


class StackedDenoisingAutoEncoder(nn.Module):
    """``encoder`` and ``decoder``: lists of Linear layers (ReLU between, none at the ends)."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        if len(dims) < 2 or min(dims) < 1:
            raise ValueError(f"dims must be >= 2 positive widths, got {dims}")
        self.dims = dims
        self.encoder = nn.ModuleList(_init(nn.Linear(a, b)) for a, b in zip(dims[:-1], dims[1:]))
        back = dims[::-1]
        self.decoder = nn.ModuleList(_init(nn.Linear(a, b)) for a, b in zip(back[:-1], back[1:]))

    @staticmethod
    def _run(layers: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(layers):
            x = layer(x)
            if i < len(layers) - 1:
                x = F.relu(x)
        return x

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The code [n, dims[-1]]."""
        return self._run(self.encoder, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction [n, dims[0]]."""
        return self._run(self.decoder, self.encode(x))


def _step_lr(optimizer: torch.optim.Optimizer, base: float, epoch: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = base * 0.1 ** ((epoch + 1) // 100)


def _batches(n: int, batch_size: int, device: torch.device) -> list[torch.Tensor]:
    return list(torch.randperm(n, device=device).split(batch_size))


def soft_assignment(code: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Student-t (α = 1) soft assignment q [n, K] of ``code`` [n, e] to ``centres`` [K, e]."""
    numerator = 1.0 / (1.0 + ((code.unsqueeze(1) - centres) ** 2).sum(-1))
    return numerator / numerator.sum(dim=1, keepdim=True)


def target_distribution(q: torch.Tensor) -> torch.Tensor:
    """DEC's sharpened target p [n, K] of q [n, K] (frequency-normalised squares)."""
    weight = q ** 2 / q.sum(0)
    return weight / weight.sum(1, keepdim=True)


def pretrain_layerwise(sdae: StackedDenoisingAutoEncoder, data: torch.Tensor, epochs: int,
                       batch_size: int, corruption: float) -> None:
    """Step 2: train each sub-autoencoder on the previous one's code, then copy it in."""
    last = len(sdae.encoder) - 1
    current = data
    for i in range(last + 1):
        enc = _init(nn.Linear(sdae.dims[i], sdae.dims[i + 1])).to(data.device)
        dec = _init(nn.Linear(sdae.dims[i + 1], sdae.dims[i])).to(data.device)
        params = [*enc.parameters(), *dec.parameters()]
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)

        def code(x: torch.Tensor, train: bool, i: int = i, enc: nn.Linear = enc) -> torch.Tensor:
            h = enc(x) if i == last else F.relu(enc(x))
            return F.dropout(h, corruption, training=train) if i < last else h

        for epoch in range(epochs):
            _step_lr(optimizer, 0.1, epoch)
            for batch in _batches(current.size(0), batch_size, data.device):
                x = current[batch]
                loss = F.mse_loss(dec(code(x, True)), x)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            sdae.encoder[i].load_state_dict(enc.state_dict())
            sdae.decoder[last - i].load_state_dict(dec.state_dict())
            current = code(current, False)


def finetune(sdae: StackedDenoisingAutoEncoder, data: torch.Tensor, epochs: int,
             batch_size: int, corruption: float) -> None:
    """Step 3: the whole SDAE on denoising reconstruction."""
    optimizer = torch.optim.SGD(sdae.parameters(), lr=0.01, momentum=0.9)
    for epoch in range(epochs):
        _step_lr(optimizer, 0.01, epoch)
        for batch in _batches(data.size(0), batch_size, data.device):
            x = data[batch]
            loss = F.mse_loss(sdae(F.dropout(x, corruption)), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def dec_clusters(embeddings: torch.Tensor, num_clusters: int, batch_size: int = 32,
                 pretrain_epochs: int = 2, finetune_epochs: int = 3, dec_epochs: int = 5,
                 corruption: float = 0.2, stopping_delta: float = 1e-6) -> torch.Tensor:
    """Cluster ids [n] in 0..K−1 of ``embeddings`` [n, e] (K = min(``num_clusters``, n))."""
    data = embeddings.detach().float()
    n, width = data.shape
    k = max(1, min(num_clusters, n))
    sdae = StackedDenoisingAutoEncoder([width, 128, 512, 128, width]).to(data.device)
    pretrain_layerwise(sdae, data, pretrain_epochs, batch_size, corruption)
    finetune(sdae, data, finetune_epochs, batch_size, corruption)
    with torch.no_grad():
        code = sdae.encode(data)
    seed = int(torch.randint(2**31 - 1, ()))
    kmeans = KMeans(n_clusters=k, n_init=20, random_state=seed).fit(code.cpu().numpy())
    previous = torch.as_tensor(kmeans.labels_.astype(np.int64), device=data.device)
    centres = nn.Parameter(torch.as_tensor(kmeans.cluster_centers_, dtype=data.dtype,
                                           device=data.device))
    optimizer = torch.optim.SGD([*sdae.encoder.parameters(), centres], lr=0.01, momentum=0.9)
    for _ in range(dec_epochs):
        for batch in _batches(n, batch_size, data.device):
            q = soft_assignment(sdae.encode(data[batch]), centres)
            loss = F.kl_div(q.log(), target_distribution(q).detach(), reduction="sum") / q.size(0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            labels = soft_assignment(sdae.encode(data), centres).argmax(dim=1)
        changed = float((labels != previous).float().mean())
        previous = labels
        if changed < stopping_delta:
            break
    return previous
