"""A tiny TorchScript model with LaMa's interface, for the lama backend's tests.

Like ``big-lama.pt`` it takes ``image`` (N, 3, H, W) RGB in [0, 1] and ``mask`` (N, 1, H, W)
with 1 = hole, needs H and W to be multiples of 8, and returns (N, 3, H, W) in [0, 1] with the
unmasked pixels copied from the input.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn


class TinyLama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.mix = nn.Conv2d(8, 8, 3, padding=1)
        self.spectral = nn.Conv2d(16, 16, 1)  # a Fourier unit, as in LaMa's FFC blocks
        self.up = nn.ConvTranspose2d(8, 3, 4, stride=2, padding=1)

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if image.shape[2] % 8 != 0 or image.shape[3] % 8 != 0:
            raise RuntimeError("image height and width must be multiples of 8")
        known = image * (1 - mask)
        x = torch.relu(self.down(torch.cat([known, mask], dim=1)))
        x = torch.relu(self.mix(x))
        freq = torch.fft.rfft2(x, norm="ortho")
        freq = self.spectral(torch.cat([freq.real, freq.imag], dim=1))
        real, imag = freq.chunk(2, dim=1)
        x = x + torch.fft.irfft2(
            torch.complex(real, imag), s=(x.shape[2], x.shape[3]), norm="ortho"
        )
        fill = torch.sigmoid(self.up(x))
        return known + fill * mask


class WrongShape(nn.Module):
    """Returns one channel instead of three."""

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return image.mean(dim=1, keepdim=True) * (1 - mask)


def build_tiny_lama(path: Path, module: nn.Module | None = None) -> Path:
    """Script ``module`` (default: a :class:`TinyLama` with weights seeded 0) and save it to
    ``path``; returns ``path``."""
    if module is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            module = TinyLama()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*torch.jit", DeprecationWarning)
        torch.jit.save(torch.jit.script(module.eval()), str(path))
    return path
