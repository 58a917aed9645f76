"""The models a run names, where they are, and fetching them on purpose.

A :class:`ModelRef` is one model a run needs: a Hugging Face repo id or local folder
(``kind="hub"``: an inpainting pipeline, a CLIP, a captioner, a detector), a single file
(``kind="file"``: LaMa's TorchScript ``big-lama.pt``), or an open_clip pretrained tag
(``kind="open_clip"``, which open_clip downloads itself). :func:`locate` finds a model without
the network: a local folder or file, or a snapshot in the Hugging Face cache
(``HF_HUB_CACHE``, by default ``HF_HOME/hub``); :func:`pull` fetches it: safetensors only, the
``fp16`` variant where the repo has one and the run computes in float16, at the hub commit
it resolves to; a known file from its release URL, checked against its published checksum
(:data:`KNOWN_FILES`). Every answer is a :class:`Located` with the resolved revision (the
hub commit, or the file's sha256) that run manifests record.

Nothing here touches the network except :func:`pull` and :func:`hub_problem`; huggingface_hub
is imported when they are called. A model that cannot be had is a :class:`ModelUnavailable`
whose one line names the model, why (offline, not found, gated, no network, no safetensors)
and the command that fixes it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from counterfactual.readers.download import DownloadError, RemoteFile, fetch

KINDS = ("hub", "file", "open_clip")

KNOWN_FILES: dict[str, RemoteFile] = {
    "big-lama.pt": RemoteFile(
        name="big-lama.pt",
        # IOPaint's LaMa (Sanster/IOPaint, iopaint/model/lama.py: LAMA_MODEL_URL and
        # LAMA_MODEL_MD5), the TorchScript export of LaMa's big-lama checkpoint.
        url="https://github.com/Sanster/models/releases/download/add_big_lama/big-lama.pt",
        size=None,
        sha256=None,
        md5="e3aa4aaa15225a33ec84f9f4bc47e500",
        extract_to=".",
        source_note="LAMA_MODEL_MD5 in IOPaint's iopaint/model/lama.py",
        part="lama",
    ),
}
"""Single-file models :func:`pull` fetches by their file name, with published checksums."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")
_KEEP_SUFFIXES = (".json", ".txt", ".model", ".tiktoken")
"""Besides the safetensors weights: configs, tokenizer and processor files."""
_COMMIT = re.compile(r"[0-9a-f]{40}")


class ModelUnavailable(ValueError):
    """A model a run needs cannot be had; the message is one line: which, why, the fix."""


@dataclass(frozen=True, slots=True)
class ModelRef:
    """One model a run needs: ``role`` (inpainter, verifier, captioner, detector), the
    ``option`` that names it, ``kind`` (:data:`KINDS`), ``name`` (a hub id, a local folder or
    file path, or ``ARCH:TAG`` for open_clip) and the weight ``variant`` to prefer
    (``"fp16"`` for a float16 run, else ``None``)."""

    role: str
    option: str
    kind: str
    name: str
    variant: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"model kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.name:
            raise ValueError(f"{self.option}: no model given")


@dataclass(frozen=True, slots=True)
class Located:
    """Where a model is, or why it is not. ``source``: ``folder``, ``file``, ``cache``,
    ``open_clip`` or ``missing``; ``revision``: the hub commit (cache) or ``sha256:...`` of a
    file; ``problem``: why it cannot be used (``None`` when it can)."""

    ref: ModelRef
    source: str
    path: str | None = None
    revision: str | None = None
    problem: str | None = None
    files: tuple[str, ...] = field(default=())

    @property
    def present(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        """The manifest's record of the model."""
        out: dict[str, Any] = {
            "role": self.ref.role,
            "option": self.ref.option,
            "name": self.ref.name,
            "source": self.source,
            "revision": self.revision,
        }
        if self.ref.variant and self.files:  # what loads: the variant where the files have it
            out["variant"] = chosen_variant(self.files, self.ref.variant) or "plain"
        elif self.ref.variant:  # files not here yet: the variant asked for
            out["variant"] = self.ref.variant
        if self.path:
            out["path"] = self.path
        if self.problem:
            out["problem"] = self.problem
        return out


def is_local(name: str) -> bool:
    """Whether a model name is a local path rather than a hub id: the one rule of the
    project (synth's checks and the paths it makes absolute, ``models list``/``pull``, the
    loaders' pinned revision). A path for certain starts like one (``/``, ``.``, ``~``), holds
    a backslash or more than one ``/`` (no hub id does), or is on this disk; anything else,
    a bare word (``gpt2``) or ``ORG/NAME``, is a hub id."""
    return (
        name.startswith((".", "/", "~"))
        or "\\" in name
        or name.count("/") > 1
        or os.path.exists(os.path.expanduser(name))
    )


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (read from the environment now, as huggingface_hub does at
    import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    """Whether the environment puts the Hugging Face hub offline (``HF_HUB_OFFLINE`` or
    ``TRANSFORMERS_OFFLINE`` true)."""
    return any(
        os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


DAMAGED = "damaged"
"""How a :class:`Located` problem starts when a known file's checksum is not the published one."""


def file_digests(path: Path) -> dict[str, str]:
    """``{"sha256": hex, "md5": hex}`` of ``path``, in one read."""
    digests = {"sha256": hashlib.sha256(), "md5": hashlib.md5(usedforsecurity=False)}
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            for digest in digests.values():
                digest.update(block)
    return {name: digest.hexdigest() for name, digest in digests.items()}


def damaged(name: str, digests: dict[str, str]) -> str | None:
    """Why a file called ``name`` is not the one :data:`KNOWN_FILES` publishes a checksum for
    (its digests, :func:`file_digests`, differ), else ``None`` (not a known file, or nothing
    published)."""
    remote = KNOWN_FILES.get(name)
    if remote is None:
        return None
    for algo in ("sha256", "md5"):
        published = getattr(remote, algo)
        if published is not None and digests[algo] != published:
            return (
                f"{DAMAGED}: its {algo.upper()} is {digests[algo]}, not the published "
                f"{published} ({remote.source_note}); `counterfactual models pull` fetches it again"
            )
    return None


def snapshot_files(folder: Path) -> tuple[str, ...]:
    """The files of a snapshot or model folder, as repo paths (``unet/config.json``)."""
    return tuple(
        sorted(
            p.relative_to(folder).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and ".cache" not in p.relative_to(folder).parts
        )
    )


def weight_problem(files: Iterable[str], safetensors: bool = True) -> str | None:
    """Why a model's files hold no weights to load (``None`` when they do): with
    ``safetensors``, no ``.safetensors`` file (what :func:`pull` fetches); else no weights of
    any format (a folder or cache the libraries load ``.bin`` from is usable)."""
    files = list(files)
    if any(f.endswith(".safetensors") for f in files):
        return None
    other = sorted({PurePosixPath(f).suffix for f in files if f.endswith(WEIGHT_SUFFIXES)})
    if other and not safetensors:
        return None
    if other:
        return f"wrong format: no safetensors weights (only {', '.join(other)})"
    return "wrong format: no weights at all"


def locate(ref: ModelRef, cache_dir: Path | None = None, *, verify: bool = False) -> Located:
    """Where ``ref`` is on this machine, without the network: a folder or file, or the hub
    cache's snapshot of ``main`` (its commit is the revision). With ``verify``, a file of
    :data:`KNOWN_FILES` is checked against its published checksum: one that differs is
    ``damaged`` (:data:`DAMAGED`, not present), which :func:`pull` fetches again."""
    if ref.kind == "open_clip":
        return Located(ref, "open_clip", problem=None)
    path = Path(ref.name).expanduser()
    if ref.kind == "file":
        if path.is_file():
            digests = file_digests(path)
            damage = damaged(path.name, digests) if verify else None
            return Located(ref, "file", str(path), f"sha256:{digests['sha256']}", damage)
        why = "a folder, not a file" if path.is_dir() else "file not found"
        return Located(ref, "missing", str(path), problem=why)
    if is_local(ref.name):
        if not path.is_dir():
            return Located(ref, "missing", str(path), problem="folder not found")
        files = snapshot_files(path)
        problem = weight_problem(files, safetensors=False)
        return Located(ref, "folder", str(path), _folder_commit(path), problem, files)
    return _cached(ref, cache_dir or hub_cache_dir())


def _folder_commit(folder: Path) -> str | None:
    """The hub commit a folder was downloaded at (``snapshot_download(local_dir=...)`` keeps
    it in ``.cache/huggingface/download/*.metadata``, first line), else ``None``."""
    for meta in sorted((folder / ".cache" / "huggingface" / "download").rglob("*.metadata")):
        try:
            first = meta.read_text(encoding="utf-8").split("\n", 1)[0].strip()
        except (OSError, UnicodeDecodeError):
            continue
        if _COMMIT.fullmatch(first):
            return first
    return None


def _repo_folder(cache_dir: Path, repo_id: str) -> Path:
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def _cached(ref: ModelRef, cache_dir: Path) -> Located:
    repo = _repo_folder(cache_dir, ref.name)
    try:
        commit = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        commit = ""
    if not _COMMIT.fullmatch(commit):
        return Located(ref, "missing", problem=f"not in the Hugging Face cache {cache_dir}")
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        return Located(ref, "missing", problem=f"not in the Hugging Face cache {cache_dir}")
    files = snapshot_files(snapshot)
    problem = weight_problem(files, safetensors=False)
    return Located(ref, "cache", str(snapshot), commit, problem, files)


HALF_DTYPES = ("float16", "bfloat16")
"""Dtypes that read the ``fp16`` weight files where a model has them (diffusers ships one half
variant; bfloat16 loads it and casts)."""


def weight_variant(dtype: str | None) -> str | None:
    """The weight variant a run in ``dtype`` prefers: ``"fp16"`` in float16 and bfloat16, else
    ``None``. The one rule :func:`pull` downloads by and the loaders load by."""
    return "fp16" if dtype in HALF_DTYPES else None


def chosen_variant(files: Iterable[str], variant: str | None) -> str | None:
    """The variant that loads from ``files``: ``variant`` where they hold its safetensors
    weights, else ``None`` (the plain files)."""
    return variant if variant and has_variant(files, variant) else None


def has_variant(files: Iterable[str], variant: str) -> bool:
    """Whether safetensors weights of ``variant`` are among ``files`` (a diffusers
    ``diffusion_pytorch_model.fp16.safetensors``, ``model.fp16-00001-of-00002.safetensors``):
    what a loader passes ``variant=`` for."""
    pattern = re.compile(rf"\.{re.escape(variant)}(-\d{{5}}-of-\d{{5}})?\.safetensors$")
    return any(pattern.search(f) for f in files)


def pipeline_components(index: dict[str, Any]) -> tuple[str, ...]:
    """The component folders a diffusers ``model_index.json`` names: its keys whose value is a
    ``[library, class]`` pair (``unet``, ``vae``, ``text_encoder``...; a ``null`` component,
    such as a removed ``safety_checker``, is none)."""
    return tuple(
        sorted(
            key
            for key, value in index.items()
            if not key.startswith("_")
            and isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, str) for v in value)
        )
    )


def select_files(
    files: Sequence[str], variant: str | None = None, components: Sequence[str] | None = None
) -> list[str]:
    """The files of a hub repo to download: its safetensors weights (per folder the
    ``variant`` ones where that folder has them, else the plain ones), configs and tokenizer
    files; no other weight format, no single-file checkpoints at the top of a diffusers
    pipeline (``model_index.json``), no README or images. ``components``: of a pipeline, only
    the top-level files and these folders (:func:`pipeline_components`: what
    ``model_index.json`` names; a repo's other folders, such as an unused ``safety_checker``
    or a second UNet, are not fetched). Raises :class:`ModelUnavailable` for a repo without
    safetensors weights."""
    if components is not None:
        files = [f for f in files if "/" not in f or f.split("/", 1)[0] in components]
    problem = weight_problem(files)
    if problem:
        raise ModelUnavailable(problem)
    pipeline = "model_index.json" in files
    by_folder: dict[str, list[str]] = {}
    for f in files:
        if f.endswith(".safetensors"):
            folder = str(PurePosixPath(f).parent)
            if pipeline and folder == ".":
                continue  # a single-file checkpoint beside the pipeline's folders
            by_folder.setdefault(folder, []).append(f)
    chosen: list[str] = []
    for weights in by_folder.values():
        if variant and has_variant(weights, variant):
            chosen += [w for w in weights if has_variant([w], variant)]
        else:
            chosen += [w for w in weights if not _any_variant(w)]
    chosen += [
        f for f in files if f.endswith(_KEEP_SUFFIXES) and ".bin.index" not in f and not _ignored(f)
    ]
    return sorted(set(chosen))


def _any_variant(name: str) -> bool:
    """A weight file of some variant: ``NAME.VARIANT.safetensors`` or
    ``NAME.VARIANT-00001-of-00002.safetensors`` (plain ones have no dot in ``NAME``)."""
    stem = re.sub(r"(-\d{5}-of-\d{5})?\.safetensors$", "", PurePosixPath(name).name)
    return "." in stem


def _ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(PurePosixPath(name).name, p) for p in (".*", "README*", "*.md"))


# -------------------------------------------------------------------------------- the hub


def hub_problem(err: BaseException) -> str:
    """Why a hub call failed, in a few words: gated, not found (404), offline, no network, or
    the HTTP status."""
    from huggingface_hub import errors

    if isinstance(err, errors.GatedRepoError):
        return "gated: accept its terms on the Hub, then `hf auth login` (or set HF_TOKEN)"
    if isinstance(err, errors.RepositoryNotFoundError):
        return "not found on the Hub (404: deleted, renamed, or private)"
    if isinstance(err, errors.RevisionNotFoundError):
        return "revision not found on the Hub (404)"
    if isinstance(err, errors.OfflineModeIsEnabled):
        return "offline (HF_HUB_OFFLINE=1) and not in the cache"
    if isinstance(err, errors.HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", None)
        return f"the Hub answered HTTP {status}" if status else f"the Hub failed: {err}"
    if isinstance(err, ModelUnavailable | DownloadError):
        return str(err)
    return f"no network ({type(err).__name__}: {' '.join(str(err).split())[:160]})"


@dataclass(frozen=True, slots=True)
class RepoInfo:
    """What :func:`pull` needs to know about a hub repo: its commit and file list."""

    sha: str
    files: tuple[str, ...]


def _repo_info(repo_id: str) -> RepoInfo:
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id)
    return RepoInfo(str(info.sha), tuple(s.rfilename for s in info.siblings or ()))


def _snapshot(repo_id: str, **kwargs: Any) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, **kwargs)


def hub_errors() -> tuple[type[BaseException], ...]:
    """What a hub call raises when it fails: huggingface_hub's errors (``OSError``,
    ``ValueError`` subclasses), and its HTTP client's transport errors (``httpx.HTTPError``:
    no route, DNS, timeouts), which derive from neither."""
    errors: list[type[BaseException]] = [OSError, ValueError, RuntimeError]
    for name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        base = getattr(module, "HTTPError", None)
        if isinstance(base, type) and issubclass(base, BaseException):
            errors.append(base)
    return tuple(errors)


RepoInfoFn = Callable[[str], RepoInfo]
SnapshotFn = Callable[..., str]


def pull(
    ref: ModelRef,
    to: Path | None = None,
    *,
    cache_dir: Path | None = None,
    repo_info: RepoInfoFn | None = None,
    snapshot: SnapshotFn | None = None,
    timeout: float = 60.0,
) -> Located:
    """Fetch ``ref`` unless :func:`locate` finds it, and say where it is.

    A hub model goes into the Hugging Face cache (``cache_dir``, default the environment's)
    or, with ``to``, into ``to/ORG/NAME`` (``snapshot_download(local_dir=...)``): the files of
    :func:`select_files` at the commit the repo's ``main`` resolves to now. A file model named
    in :data:`KNOWN_FILES` is downloaded from its release URL, checked against its published
    checksum, and put where the run names it (``ref.name``), or at ``to/NAME``. A local folder
    or file that exists is left alone. ``repo_info`` and ``snapshot`` replace the hub calls
    (tests). Raises :class:`ModelUnavailable` (one line: model, why, fix)."""
    if ref.kind == "open_clip":
        return locate(ref)
    if ref.kind == "file":
        return _pull_file(ref, to, timeout)
    dest = None if to is None or is_local(ref.name) else Path(to) / ref.name
    found = locate(ref if dest is None else _at(ref, dest), cache_dir)
    if found.present and found.source != "missing":
        return found
    if is_local(ref.name):
        raise ModelUnavailable(f"{_who(ref)}: {found.problem}; a local model is not fetched")
    try:
        info = (repo_info or _repo_info)(ref.name)
        kwargs: dict[str, Any] = {"revision": info.sha}
        if dest is not None:
            kwargs["local_dir"] = str(dest)
        elif cache_dir is not None:
            kwargs["cache_dir"] = str(cache_dir)
        components = None
        if "model_index.json" in info.files:  # a pipeline: fetch the components it names
            index = Path(
                (snapshot or _snapshot)(ref.name, allow_patterns=["model_index.json"], **kwargs)
            )
            components = pipeline_components(_read_index(index / "model_index.json"))
        wanted = select_files(info.files, ref.variant, components)
        kwargs["allow_patterns"] = wanted
        path = Path((snapshot or _snapshot)(ref.name, **kwargs))
        if dest is None:  # offline loads resolve `main` through refs/main
            _write_ref(_repo_folder(cache_dir or hub_cache_dir(), ref.name), info.sha)
    except hub_errors() as err:
        raise ModelUnavailable(f"{_who(ref)}: {hub_problem(err)}") from err
    files = snapshot_files(path)
    missing = sorted(set(wanted) - set(files))
    if missing:
        raise ModelUnavailable(
            f"{_who(ref)}: the download lacks {len(missing)} file(s) ({missing[0]}, ...)"
        )
    return Located(ref, "folder" if dest is not None else "cache", str(path), info.sha, None, files)


def _read_index(path: Path) -> dict[str, Any]:
    """A pipeline's ``model_index.json``, or :class:`ModelUnavailable` (why, in a few words)."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelUnavailable(f"unreadable model_index.json ({err})") from err
    if not isinstance(index, dict):
        raise ModelUnavailable("model_index.json is not a JSON object")
    return index


def _write_ref(repo: Path, commit: str) -> None:
    """Point the cache's ``refs/main`` at ``commit`` (a download at a commit hash writes no
    ref, and an offline ``from_pretrained`` resolves ``main`` through it)."""
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")


def _at(ref: ModelRef, path: Path) -> ModelRef:
    return ModelRef(ref.role, ref.option, ref.kind, str(path), ref.variant)


def _pull_file(ref: ModelRef, to: Path | None, timeout: float) -> Located:
    target = Path(ref.name).expanduser()
    if to is not None:
        target = Path(to) / target.name
    found = locate(_at(ref, target), verify=True)
    if found.present:
        return found  # a damaged file is fetched again: the download replaces it
    remote = KNOWN_FILES.get(target.name)
    if remote is None:
        raise ModelUnavailable(
            f"{_who(ref)}: {found.problem}, and {target.name!r} is not a file this command "
            f"knows how to fetch ({', '.join(KNOWN_FILES)}); put the file there yourself"
        )
    # the download goes to a folder beside the target, kept when it breaks off (a rerun
    # resumes it) and removed once the verified file is in place
    staging = target.parent / f".{target.name}.download"
    try:
        staging.mkdir(parents=True, exist_ok=True)
        result = fetch(remote, staging, timeout=timeout)
        os.replace(result.path, target)
    except (DownloadError, OSError) as err:
        raise ModelUnavailable(f"{_who(ref)}: {hub_problem(err)}") from err
    shutil.rmtree(staging, ignore_errors=True)
    return locate(_at(ref, target), verify=True)


def _who(ref: ModelRef) -> str:
    return f"{ref.role} {ref.name} ({ref.option})"


def unavailable_line(missing: Sequence[Located], fix: str) -> str:
    """One line for the models that cannot be had: each with why, then the fixing command."""
    parts = [f"{_who(m.ref)}: {m.problem}" for m in missing]
    noun = "model" if len(missing) == 1 else "models"
    return f"{noun} not available: {'; '.join(parts)}. Fetch with `{fix}`"


def check_available(
    refs: Sequence[ModelRef],
    fix: str,
    *,
    cache_dir: Path | None = None,
    repo_info: RepoInfoFn | None = None,
) -> list[Located]:
    """Every model of ``refs`` located; raises :class:`ModelUnavailable` (one line naming
    each missing model, why, and ``fix``) when one cannot be had (:func:`located`)."""
    found = located(refs, cache_dir=cache_dir, repo_info=repo_info)
    missing = [loc for loc in found if not loc.present]
    if missing:
        raise ModelUnavailable(unavailable_line(missing, fix))
    return found


def located(
    refs: Sequence[ModelRef],
    *,
    cache_dir: Path | None = None,
    repo_info: RepoInfoFn | None = None,
) -> list[Located]:
    """Every model of ``refs`` located, in order; one that cannot be had is not
    :attr:`~Located.present` and its ``problem`` says why. A hub model that is not in the
    cache can still be had when the hub is reachable, has it, and it has safetensors weights
    (one metadata call per such model; its weights then download as the run loads it);
    offline it cannot."""
    found = [locate(ref, cache_dir) for ref in refs]
    for i, loc in enumerate(found):
        ref = loc.ref
        if loc.present or loc.source != "missing" or ref.kind != "hub" or is_local(ref.name):
            continue
        if offline():
            found[i] = Located(
                ref, "missing", problem="offline (HF_HUB_OFFLINE=1) and not in the cache"
            )
            continue
        try:
            info = (repo_info or _repo_info)(ref.name)
            select_files(info.files, ref.variant)
            found[i] = Located(ref, "hub", revision=info.sha)
        except hub_errors() as err:
            found[i] = Located(ref, "missing", problem=hub_problem(err))
    return found
