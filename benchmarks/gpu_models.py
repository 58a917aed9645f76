"""@@DOC@@"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import ROOT

BIG_LAMA = {"ngf": 64, "n_downsampling": 3, "n_blocks": 18, "ratio": 0.75}
"""big-lama's generator (LaMa's ``configs/training/big-lama.yaml``: ``ffc_resnet``, ngf 64, 3
downsamplings to 512 channels, 18 FFC resnet blocks, global ratio 0.75, no LFU)."""


REDUCED_LAMA = {"ngf": 8, "n_downsampling": 3, "n_blocks": 2, "ratio": 0.75}


def lama_like(ngf: int, n_downsampling: int, n_blocks: int, ratio: float) -> Any:
    """A LaMa-like FFC generator with big-lama's contract: ``forward(image, mask)``, ``image``
    ``(N, 3, H, W)`` RGB in [0, 1], ``mask`` ``(N, 1, H, W)`` 1 = hole, H and W multiples of 8;
    returns ``(N, 3, H, W)`` in [0, 1] with the known pixels copied. Convolutional head and
    tail as LaMa's; the body is ``n_blocks`` residual blocks of two fast Fourier convolutions
    (local 3x3 paths and a spectral transform on the global ``ratio`` of the channels). With
    :data:`BIG_LAMA` it has about 51M parameters, as big-lama."""
    import torch
    from torch import nn

    class FourierUnit(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2 * channels, 2 * channels, 1, bias=False)
            self.bn = nn.BatchNorm2d(2 * channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            freq = torch.fft.rfft2(x, norm="ortho")
            y = torch.relu(self.bn(self.conv(torch.cat([freq.real, freq.imag], dim=1))))
            real, imag = y.chunk(2, dim=1)
            return torch.fft.irfft2(
                torch.complex(real, imag), s=(x.shape[2], x.shape[3]), norm="ortho"
            )

    class SpectralTransform(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            half = cout // 2
            self.conv1 = nn.Sequential(
                nn.Conv2d(cin, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU()
            )
            self.fu = FourierUnit(half)
            self.conv2 = nn.Conv2d(half, cout, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.conv1(x)
            return self.conv2(x + self.fu(x))

    class FFC(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.g = int(channels * ratio)
            self.l = channels - self.g
            self.l2l = nn.Conv2d(self.l, self.l, 3, padding=1, padding_mode="reflect", bias=False)
            self.l2g = nn.Conv2d(self.l, self.g, 3, padding=1, padding_mode="reflect", bias=False)
            self.g2l = nn.Conv2d(self.g, self.l, 3, padding=1, padding_mode="reflect", bias=False)
            self.g2g = SpectralTransform(self.g, self.g)
            self.bn_l, self.bn_g = nn.BatchNorm2d(self.l), nn.BatchNorm2d(self.g)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            xl, xg = x[:, : self.l], x[:, self.l :]
            yl = torch.relu(self.bn_l(self.l2l(xl) + self.g2l(xg)))
            yg = torch.relu(self.bn_g(self.l2g(xl) + self.g2g(xg)))
            return torch.cat([yl, yg], dim=1)

    class Block(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.a, self.b = FFC(channels), FFC(channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.b(self.a(x))

    def conv_bn(cin: int, cout: int, **kw: Any) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, bias=False, **kw), nn.BatchNorm2d(cout), nn.ReLU()
        )

    layers: list[nn.Module] = [conv_bn(4, ngf, kernel_size=7, padding=3, padding_mode="reflect")]
    ch = ngf
    for _ in range(n_downsampling):
        layers.append(conv_bn(ch, ch * 2, kernel_size=3, stride=2, padding=1))
        ch *= 2
    layers += [Block(ch) for _ in range(n_blocks)]
    for _ in range(n_downsampling):
        layers += [
            nn.ConvTranspose2d(ch, ch // 2, 3, stride=2, padding=1, output_padding=1, bias=False),
            nn.BatchNorm2d(ch // 2),
            nn.ReLU(),
        ]
        ch //= 2
    layers += [nn.Conv2d(ch, 3, 7, padding=3, padding_mode="reflect"), nn.Sigmoid()]

    class Generator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(*layers)

        def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            known = image * (1 - mask)
            fill = self.net(torch.cat([known, mask], dim=1))
            return known + fill * mask

    return Generator().eval()


def save_lama_like(path: Path, sizes: dict[str, Any], seed: int = 0) -> tuple[Path, int]:
    """:func:`lama_like` with ``sizes``, random weights seeded ``seed``, scripted and saved to
    ``path`` (what the ``lama`` backend loads); returns the path and the parameter count."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = lama_like(**sizes)
    params = sum(p.numel() for p in model.parameters())
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*torch.jit", DeprecationWarning)
        torch.jit.save(torch.jit.script(model), str(path))
    return path, params


CLIP_VIT_L14 = {
    "vision": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "image_size": 224,
    },
    "text": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
    },
    "projection_dim": 768,
}
"""openai/clip-vit-large-patch14's ``config.json`` sizes (the coco config's verifier)."""


CLIP_224_TINY = {
    "vision": {
        "hidden_size": 32,
        "intermediate_size": 37,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "patch_size": 32,
        "image_size": 224,
    },
    "text": {
        "hidden_size": 32,
        "intermediate_size": 37,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
    },
    "projection_dim": 16,
}
"""A tiny CLIP that still takes CLIP's 224 px input, so its preprocessing costs what ViT-L/14's
does (resize, crop and normalise to 224 px) while its model costs little."""


def save_clip(path: Path, sizes: dict[str, Any], seed: int = 0) -> str:
    """A random CLIP of ``sizes`` with CLIP's image processor (224 px, bicubic, centre crop)
    and the tests' offline BPE tokenizer, saved to ``path``; returns its ``hf-clip:`` spec."""
    import torch
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTokenizer,
    )

    from counterfactual.testing import write_clip_tokenizer_files

    write_clip_tokenizer_files(path.parent / f"{path.name}-tok")
    tokenizer = CLIPTokenizer.from_pretrained(str(path.parent / f"{path.name}-tok"))
    text = dict(sizes["text"], vocab_size=len(tokenizer), max_position_embeddings=77)
    text |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    text["pad_token_id"] = tokenizer.eos_token_id
    config = CLIPConfig(
        text_config=text, vision_config=sizes["vision"], projection_dim=sizes["projection_dim"]
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        CLIPModel(config).save_pretrained(str(path))
    CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(
        str(path)
    )
    return f"hf-clip:{path}"


def coco_requests(work: Path, n: int, seed: int = 3) -> list[Any]:
    """One ``EditRequest`` per generated 640x480 COCO-like picture: one annotated object's box
    as the mask, and the picture's boxes (``xywh``) for verification."""
    from counterfactual.image import EditRequest
    from counterfactual.imageio import load_rgb
    from counterfactual.method.masks import box_mask
    from counterfactual.readers.coco import read_coco
    from counterfactual.readers.generate import generate_coco

    files = generate_coco(work / f"model-coco-{n}", n, seed=seed)
    records = read_coco(files.instances, files.captions, files.images).records
    rng = np.random.default_rng(0)
    out = []
    for i, record in enumerate(records):
        objects = [o for o in record.objects if o.bbox[2] >= 1 and o.bbox[3] >= 1]
        if not objects:
            continue
        obj = objects[int(rng.integers(len(objects)))]
        mask = box_mask(record.height, record.width, [obj.bbox])
        if not mask.any():
            continue
        image = load_rgb(str(Path(str(record.root)) / record.file))
        out.append(EditRequest(image, mask, (obj.category,), (), i))
    return out


def tiny_lama(work: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_lama import build_tiny_lama

    return build_tiny_lama(work / "tiny-lama.pt")


def counted(editor: Any) -> list[int]:
    """Count the forwards (and their batch sizes) of a LaMa editor's model."""
    sizes: list[int] = []
    model = editor._model

    def counting(image: Any, mask: Any) -> Any:
        sizes.append(int(image.shape[0]))
        return model(image, mask)

    editor._model = counting
    return sizes


def per_item(fn: Callable[[], object], items: int, repeat: int = 2) -> float:
    return alternated({"": fn}, items, repeat)[""]


def alternated(
    fns: dict[str, Callable[[], object]], items: int, repeat: int = 7
) -> dict[str, float]:
    """Seconds per item of each of ``fns``, run in turn ``repeat`` times (best of them), so a
    shared machine's load falls on all of them alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds / items for name, seconds in best.items()}


def verify_requests(requests: list[Any]) -> list[Any]:
    """A :class:`VerifyRequest` per edit request: its removed box against two kept boxes."""
    from counterfactual.method.verify import VerifyRequest

    out = []
    for r in requests:
        ys, xs = np.nonzero(r.mask)
        box = (float(xs.min()), float(ys.min()), float(np.ptp(xs) + 1), float(np.ptp(ys) + 1))
        out.append(
            VerifyRequest(
                r.image,
                r.image,
                {"dog": [box]},
                {"person": [(200, 60, 140, 300)], "chair": [(420, 250, 150, 180)]},
                ("dog",),
                ("person", "chair"),
                "a person on a chair",
            )  # fmt: skip
        )
    return out


class Busy:
    """Samples every GPU's utilisation through NVML (``pynvml``) every 0.1 s while running;
    ``fraction()`` is the mean busy share, ``None`` when NVML cannot be read."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.stop = threading.Event()
        self.handles: list[Any] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        try:
            import pynvml
        except ImportError:
            print("GPU busy fraction: not measured (pynvml is not installed)")
            return
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as err:
            print(f"GPU busy fraction: not measured (NVML: {err})")

    def __enter__(self) -> Busy:
        if self.handles:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.handles:
            self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            rates = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles]
            self.samples.append(float(np.mean(rates)) / 100)

    def fraction(self) -> float | None:
        return float(np.mean(self.samples)) if self.samples else None


def bare_loop(model_path: Path, device: str, items: int, batch: int, side: int = 512) -> float:
    """Items/s of the TorchScript model alone on ``device``: batches of ``batch`` random
    pictures with a box mask on a ``side`` px canvas (the default ``lama_work_side``), float32,
    inputs already on the device: the floor a pipeline of this model can reach."""
    import torch

    model = torch.jit.load(str(model_path), map_location=device).eval()
    image = torch.rand(batch, 3, side, side, device=device)
    mask = torch.zeros(batch, 1, side, side, device=device)
    mask[:, :, side // 4 : side // 2, side // 4 : side // 2] = 1
    rounds = max(1, items // batch)
    with torch.inference_mode():
        model(image, mask)  # warm-up
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(rounds):
            model(image, mask)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return rounds * batch / (time.perf_counter() - start)


class NoBusy:
    def __enter__(self) -> NoBusy:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def fraction(self) -> None:
        return None


SD2_INPAINT = {
    "unet": {
        "in_channels": 9,
        "out_channels": 4,
        "block_out_channels": (320, 640, 1280, 1280),
        "layers_per_block": 2,
        "cross_attention_dim": 1024,
        "attention_head_dim": (5, 10, 20, 20),
        "use_linear_projection": True,
        "down_block_types": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        "up_block_types": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        "sample_size": 64,
    },
    "vae": {"block_out_channels": (128, 256, 512, 512), "latent_channels": 4, "sample_size": 512},
    "text": [
        {"hidden_size": 1024, "num_hidden_layers": 23, "num_attention_heads": 16,
         "intermediate_size": 4096, "projection_dim": 512, "hidden_act": "gelu"},
    ],
}  # fmt: skip
"""stabilityai/stable-diffusion-2-inpainting's published configs (``unet/config.json``,
``vae/config.json``, ``text_encoder/config.json``: OpenCLIP ViT-H's text tower as a
``CLIPTextModel``, 23 of its 24 layers, as SD 2 uses the penultimate one)."""

SD2_REDUCED = {
    "unet": dict(
        SD2_INPAINT["unet"],
        block_out_channels=(32, 32, 64, 64),
        layers_per_block=1,
        cross_attention_dim=32,
        attention_head_dim=(2, 2, 4, 4),
        sample_size=16,
    ),
    "vae": {"block_out_channels": (32, 32, 32, 32), "latent_channels": 4, "sample_size": 128},
    "text": [
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 37, "projection_dim": 32, "hidden_act": "gelu"},
    ],
}  # fmt: skip
"""SD 2 inpainting's shape (4 UNet levels, three with cross-attention, 4 VAE levels, a 9-channel
UNet input) at tiny widths, so the CPU runs it in seconds."""

SDXL_INPAINT = {
    "unet": {
        "in_channels": 9,
        "out_channels": 4,
        "block_out_channels": (320, 640, 1280),
        "layers_per_block": 2,
        "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        "transformer_layers_per_block": (1, 2, 10),
        "attention_head_dim": (5, 10, 20),
        "cross_attention_dim": 2048,
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": 256,
        "projection_class_embeddings_input_dim": 2816,
        "use_linear_projection": True,
        "sample_size": 128,
    },
    "vae": {"block_out_channels": (128, 256, 512, 512), "latent_channels": 4, "sample_size": 1024},
    "text": [
        {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
         "intermediate_size": 3072, "projection_dim": 768, "hidden_act": "quick_gelu"},
        {"hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 20,
         "intermediate_size": 5120, "projection_dim": 1280, "hidden_act": "gelu"},
    ],
}  # fmt: skip
"""diffusers/stable-diffusion-xl-1.0-inpainting-0.1's published configs, which RORem
(LetsThink/RORem) fine-tunes: a 9-channel SDXL UNet (``text_time`` micro-conditioning: six size
numbers of 256 dims and the 1280-dim pooled text, 2816), CLIP ViT-L's text tower and OpenCLIP
bigG's with its projection (their hidden states concatenated: 2048)."""

SDXL_REDUCED = {
    "unet": dict(
        SDXL_INPAINT["unet"],
        block_out_channels=(32, 32, 64),
        layers_per_block=1,
        transformer_layers_per_block=(1, 1, 2),
        attention_head_dim=(2, 2, 4),
        cross_attention_dim=64,
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + 32,
        sample_size=16,
    ),
    "vae": {"block_out_channels": (32, 32, 32, 32), "latent_channels": 4, "sample_size": 128},
    "text": [
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 37, "projection_dim": 32, "hidden_act": "quick_gelu"},
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 37, "projection_dim": 32, "hidden_act": "gelu"},
    ],
}  # fmt: skip
"""SDXL inpainting's shape (3 UNet levels, transformer depth growing with the level,
``text_time`` conditioning, two text encoders) at tiny widths."""

CLIP_VOCAB = 49408
"""CLIP's BPE vocabulary (the published text encoders' embedding rows)."""


def diffusion_unet(sizes: dict[str, Any]) -> Any:
    """The ``UNet2DConditionModel`` of ``sizes["unet"]`` (random weights on the current
    default device: under ``with torch.device("meta")`` nothing is allocated)."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(**sizes["unet"])


def diffusion_vae(sizes: dict[str, Any]) -> Any:
    from diffusers import AutoencoderKL

    levels = len(sizes["vae"]["block_out_channels"])
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        layers_per_block=2,
        **sizes["vae"],
    )


def diffusion_text_encoders(
    sizes: dict[str, Any], vocab: int = CLIP_VOCAB, tokens: dict[str, int] | None = None
) -> list[Any]:
    """The text encoders of ``sizes["text"]``: one ``CLIPTextModel`` (SD 2), or SDXL's
    ``CLIPTextModel`` and ``CLIPTextModelWithProjection``; ``tokens``: the tokenizer's
    ``bos``/``eos``/``pad`` ids."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    out = []
    for i, text in enumerate(sizes["text"]):
        config = CLIPTextConfig(
            vocab_size=vocab, max_position_embeddings=77, **text, **(tokens or {})
        )
        cls = CLIPTextModelWithProjection if i == 1 else CLIPTextModel
        out.append(cls(config))
    return out


def param_count(build: Callable[[], Any]) -> int:
    """Parameters of the model ``build()`` makes, built on the meta device (no memory)."""
    import torch

    with torch.device("meta"):
        model = build()
    return sum(p.numel() for p in model.parameters())


def save_diffusion_inpaint(path: Path, sizes: dict[str, Any], seed: int = 0) -> Path:
    """An SD 2 (one text encoder) or SDXL (two) inpainting pipeline of ``sizes``, random weights
    seeded ``seed``, the tests' offline CLIP tokenizer, ``save_pretrained`` to ``path`` (what
    ``--inpaint-model DIR`` loads: ``StableDiffusionInpaintPipeline`` or
    ``StableDiffusionXLInpaintPipeline``)."""
    import torch
    from diffusers import (
        DDIMScheduler,
        EulerDiscreteScheduler,
        StableDiffusionInpaintPipeline,
        StableDiffusionXLInpaintPipeline,
    )
    from transformers import CLIPTokenizer

    from counterfactual.testing import write_clip_tokenizer_files

    write_clip_tokenizer_files(path.parent / f"{path.name}-tok")
    tokenizer = CLIPTokenizer.from_pretrained(
        str(path.parent / f"{path.name}-tok"), model_max_length=77
    )
    eos = tokenizer.eos_token_id
    tokens = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos, "pad_token_id": eos}
    schedule = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear"}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet, vae = diffusion_unet(sizes), diffusion_vae(sizes)
        encoders = diffusion_text_encoders(sizes, len(tokenizer), tokens)
    if len(encoders) == 1:
        pipeline: Any = StableDiffusionInpaintPipeline(
            vae=vae,
            text_encoder=encoders[0],
            tokenizer=tokenizer,
            unet=unet,
            scheduler=DDIMScheduler(**schedule, steps_offset=1, clip_sample=False),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    else:
        pipeline = StableDiffusionXLInpaintPipeline(
            vae=vae,
            text_encoder=encoders[0],
            text_encoder_2=encoders[1],
            tokenizer=tokenizer,
            tokenizer_2=tokenizer,
            unet=unet,
            scheduler=EulerDiscreteScheduler(
                **schedule, steps_offset=1, timestep_spacing="leading"
            ),
            requires_aesthetics_score=False,
            force_zeros_for_empty_prompt=True,
        )
    pipeline.save_pretrained(str(path))
    return path
