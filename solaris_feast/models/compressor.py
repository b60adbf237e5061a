"""The embedding compressor: ``h(u, i)`` (D = 128) to ``z(u, i)`` (d = 32) and back.

It starts *as* PCA: the linear path is initialised with the top-d principal directions, and
the non-linear residual paths start at zero. Training then can only move it below PCA's
reconstruction error on the data it sees, instead of having to rediscover PCA by SGD.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn


class CompressorConfig(BaseModel):
    """Sizes of the compressor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_dim: int = Field(128, gt=0)
    """D, the FM representation's dimension."""
    code_dim: int = Field(32, gt=0)
    """d, the dimension of the stored embedding ``z``."""
    hidden_dim: int = Field(128, gt=0)
    """Width of the non-linear residual paths."""


class PCA:
    """Principal components of ``(N, D)`` data: the brute-force reference for the compressor."""

    def __init__(self, data: torch.Tensor, dim: int) -> None:
        if data.ndim != 2 or data.shape[1] < dim:
            raise ValueError(f"PCA to {dim} needs (N, D>=dim) data, got {tuple(data.shape)}")
        x = data.double()
        self.mean = x.mean(0)
        # Eigendecomposition of the covariance is exact and cheap at D = 128.
        cov = (x - self.mean).T @ (x - self.mean) / max(len(x) - 1, 1)
        _, vecs = torch.linalg.eigh(cov)
        self.components = vecs[:, -dim:].flip(-1).T.contiguous()  # (dim, D)

    def encode(self, h: torch.Tensor) -> torch.Tensor:
        return ((h.double() - self.mean) @ self.components.T).to(h.dtype)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return (z.double() @ self.components + self.mean).to(z.dtype)

    def reconstruction_mse(self, h: torch.Tensor) -> float:
        return float(((self.decode(self.encode(h)) - h) ** 2).mean())


class EmbeddingCompressor(nn.Module):
    """Autoencoder ``(B, D) -> (B, d) -> (B, D)``: a linear (PCA-initialised) path plus
    zero-initialised non-linear residuals on both sides."""

    mean: torch.Tensor

    def __init__(self, config: CompressorConfig | None = None) -> None:
        super().__init__()
        cfg = config or CompressorConfig()
        if cfg.code_dim > cfg.input_dim:
            raise ValueError(f"code_dim {cfg.code_dim} must not exceed input_dim {cfg.input_dim}")
        self.config = cfg
        self.register_buffer("mean", torch.zeros(cfg.input_dim))
        self.enc_linear = nn.Linear(cfg.input_dim, cfg.code_dim, bias=False)
        self.enc_residual = nn.Sequential(
            nn.Linear(cfg.input_dim, cfg.hidden_dim),
            nn.GELU(),
            nn.Linear(cfg.hidden_dim, cfg.code_dim),
        )
        self.dec_linear = nn.Linear(cfg.code_dim, cfg.input_dim, bias=False)
        self.dec_residual = nn.Sequential(
            nn.Linear(cfg.code_dim, cfg.hidden_dim),
            nn.GELU(),
            nn.Linear(cfg.hidden_dim, cfg.input_dim),
        )
        for residual in (self.enc_residual, self.dec_residual):
            last = residual[-1]
            if isinstance(last, nn.Linear):
                nn.init.zeros_(last.weight)
                nn.init.zeros_(last.bias)

    def init_from_pca(self, pca: PCA) -> None:
        with torch.no_grad():
            self.mean.copy_(pca.mean.float())
            self.enc_linear.weight.copy_(pca.components.float())
            self.dec_linear.weight.copy_(pca.components.T.float())

    def encode(self, h: torch.Tensor) -> torch.Tensor:
        """``(B, D) -> (B, d)``."""
        centred = h - self.mean
        return self.enc_linear(centred) + self.enc_residual(centred)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """``(B, d) -> (B, D)``."""
        return self.mean + self.dec_linear(z) + self.dec_residual(z)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(h))
