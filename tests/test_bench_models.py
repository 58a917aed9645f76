"""The model-size sections of `make bench` (benchmarks/sections/lama_batches.py, verify_cost.py,
gpu.py; the models in benchmarks/gpu_models.py) in a reduced mode: LaMa
forwards per batch, verify's cost per item, and the LaMa-like generator's contract and size."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
gpu_models = pytest.importorskip("gpu_models")
gpu = pytest.importorskip("sections.gpu")
lama_batches = pytest.importorskip("sections.lama_batches")
verify_cost = pytest.importorskip("sections.verify_cost")


def test_lama_batches_counts_fewer_forwards_on_canvases(tmp_path):
    figures = lama_batches.bench_lama_batches(tmp_path, 16)
    exact = figures["lama_batches_exact_forwards_per_batch"]
    canvas = figures["lama_batches_canvas_forwards_per_batch"]
    assert 1 <= canvas < exact <= 8  # 16 COCO-like crops: two batches of 8
    assert figures["lama_batches_forwards_exact_over_canvas"] == pytest.approx(exact / canvas)
    assert figures["lama_batches_canvas_items_per_forward"] == pytest.approx(8 / canvas)


def test_verify_cost_reports_both_paths_against_the_inpainter(tmp_path):
    figures = verify_cost.bench_verify_cost(tmp_path, 4)
    assert (
        figures["verify_cost_items"] == 4 and figures["verify_cost_crops_per_item"] == 4
    )  # dog before and after, 2 kept
    for name in ("old", "new"):
        ms = figures[f"verify_cost_actor_ms_per_item_{name}"]
        assert ms > 0
        ratio = figures[f"verify_cost_{name}_over_inpaint"]
        assert ratio == pytest.approx(ms / figures["verify_cost_inpaint_tiny_lama_ms_per_item"])


def test_the_lama_like_generator_keeps_big_lamas_contract_and_size(tmp_path):
    import torch

    from counterfactual.image import EditRequest, ImageConfig, make_editor
    from counterfactual.image.lama import LamaConfig

    path, params = gpu_models.save_lama_like(tmp_path / "lama.pt", gpu_models.REDUCED_LAMA)
    model = torch.jit.load(str(path))
    image = torch.rand(2, 3, 64, 96)
    mask = torch.zeros(2, 1, 64, 96)
    mask[:, :, 8:24, 16:40] = 1
    with torch.inference_mode():
        out = model(image, mask)
    assert out.shape == image.shape and 0 <= float(out.min()) and float(out.max()) <= 1
    assert torch.equal(out * (1 - mask), image * (1 - mask))  # known pixels copied
    editor = make_editor(ImageConfig(method="inpaint", backend="lama", lama=LamaConfig(str(path))))
    picture = np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    box = np.zeros((120, 160), np.uint8)
    box[30:60, 40:90] = 255
    (edited,) = editor([EditRequest(picture, box, ("dog",), (), 0)])
    assert edited.shape == picture.shape and np.array_equal(edited[box == 0], picture[box == 0])
    assert params < 1e6
    big = gpu_models.lama_like(**gpu_models.BIG_LAMA)
    assert 49e6 < sum(p.numel() for p in big.parameters()) < 53e6  # big-lama: about 51M


@pytest.mark.slow
def test_gpu_section_runs_reduced_on_cpu(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("on CUDA the section runs at full size")
    import common

    runtimes = []

    def ray_run(*args, runtime=None, **kwargs):
        runtimes.append(runtime)
        return common.ray_run(*args, runtime=runtime, **kwargs)

    figures = gpu.bench_gpu(tmp_path, 8, ray_run, common.generated)
    assert "GPU rows: not measured (no CUDA device)" in capsys.readouterr().out
    assert figures["gpu_samples"] > 0 and figures["gpu_pipeline_items_per_s"] > 0
    assert "gpu_lama_items_per_s_per_gpu" not in figures
    assert runtimes == [gpu.models_runtime(False, "float32")]


def test_the_gpu_section_puts_its_models_on_cuda_when_it_has_one():
    """Both halves hand the run a runtime: without one, its models stayed on the CPU in every
    shard worker on a GPU machine (seen on an H200: no model actor, the GPU idle)."""
    from counterfactual.synth.plan import Runtime

    assert gpu.models_runtime(True, "float32") == Runtime(device="cuda", dtype="float32")
    assert gpu.models_runtime(True, "float16") == Runtime(device="cuda", dtype="float16")
    assert gpu.models_runtime(False, "float16") == Runtime()


gpu_node = pytest.importorskip("sections.gpu_node")

PUBLISHED = [
    # model, part, parameters of the published checkpoint (counted from our build of its config)
    ("SD2_INPAINT", "unet", 865_925_124),
    ("SD2_INPAINT", "vae", 83_653_863),
    ("SD2_INPAINT", "text", 340_387_840),
    ("SDXL_INPAINT", "unet", 2_567_478_084),
    ("SDXL_INPAINT", "vae", 83_653_863),
    ("SDXL_INPAINT", "text", 123_060_480 + 694_659_840),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "part", "params"), PUBLISHED)
def test_full_size_diffusion_configs_have_the_published_sizes(model, part, params):
    """Built on the meta device (nothing allocated): SD 2 inpainting's UNet about 866M
    parameters, SDXL inpainting's (RORem's) about 2.57B, their VAE 83.7M, SD 2's OpenCLIP
    ViT-H text tower 340M, SDXL's CLIP-L 123M and bigG 695M."""
    sizes = getattr(gpu_models, model)
    build = {
        "unet": lambda: gpu_models.diffusion_unet(sizes),
        "vae": lambda: gpu_models.diffusion_vae(sizes),
    }
    if part == "text":
        import torch

        with torch.device("meta"):
            encoders = gpu_models.diffusion_text_encoders(sizes)
        count = sum(p.numel() for m in encoders for p in m.parameters())
    else:
        count = gpu_models.param_count(build[part])
    assert count == params


@pytest.mark.parametrize("model", ["SD2_REDUCED", "SDXL_REDUCED"])
def test_reduced_diffusion_pipelines_inpaint_through_the_diffusers_eraser(tmp_path, model):
    """The reduced SD 2 / SDXL pipelines (same shape, tiny widths), saved and loaded by folder
    as ``--inpaint-model DIR`` loads them, run one inpaint on CPU: only the masked pixels
    change."""
    from counterfactual.image import EditRequest, ImageConfig, make_editor
    from counterfactual.image.diffusion import DiffusersConfig

    folder = gpu_models.save_diffusion_inpaint(tmp_path / model, getattr(gpu_models, model))
    config = ImageConfig(
        method="inpaint",
        backend="diffusers",
        diffusers=DiffusersConfig(model=str(folder), steps=2, resolution=128),
    )
    editor = make_editor(config)
    picture = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    box = np.zeros((96, 128), np.uint8)
    box[20:60, 30:90] = 255
    (edited,) = editor([EditRequest(picture, box, ("dog",), ("person",), 0)])
    assert edited.shape == picture.shape
    assert np.array_equal(edited[box == 0], picture[box == 0])
    assert not np.array_equal(edited[box > 0], picture[box > 0])


def _log(folder: Path, gpu: int, spans: list[tuple[float, float]]) -> None:
    lines = [f"[{b}, {e}, 8]" for b, e in spans]
    (folder / f"{gpu}.jsonl").write_text("\n".join(lines) + "\n")


def test_gpu_node_busy_fraction_is_a_number_on_a_small_run(tmp_path):
    """Eight GPUs of one batch each, one after another (no window where all 8 had work): the
    mean of each GPU's own busy share (1.0 here), not nan; a run with a window keeps its rule."""
    for gpu in range(8):
        _log(tmp_path, gpu, [(gpu * 1.0, gpu * 1.0 + 1.0)])
    small = gpu_node.busy_fractions(tmp_path)
    assert small["busy_fraction"] == pytest.approx(1.0) and small["window_seconds"] == 0
    assert small["busy_fraction_whole_run"] == pytest.approx(8 / (8 * 8))
    for gpu in range(8):  # all busy from 1 to 5, but GPU 0 idle from 2 to 3
        spans = [(0.0, 2.0), (3.0, 5.0)] if gpu == 0 else [(1.0, 5.0)]
        _log(tmp_path, gpu, spans)
    big = gpu_node.busy_fractions(tmp_path)
    assert big["window_seconds"] == 4.0
    assert big["busy_fraction"] == pytest.approx((7 * 4 + 3) / (8 * 4))
