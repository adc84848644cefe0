"""The predictor image of ``ferry deploy kserve``: ferry's wheel built from its checkout, the
constraints pinning its dependencies as installed here, the Dockerfile and the image's tag.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ferry._version import __version__
from ferry.deploy._kserve_layout import (
    BASE_IMAGE,
    CONSTRAINTS_FILE,
    CONTAINER_PORT,
    MODEL_DIR,
    MODEL_MOUNT,
    USER_ID,
    WHEEL_DIR,
)
from ferry.errors import FerryError, InvalidInputError

__all__ = [
    "build_wheel",
    "check_wheel_file",
    "constraints",
    "dockerfile_text",
    "expected_wheel_name",
    "image_tag",
    "project_root",
]

logger = logging.getLogger(__name__)


def project_root() -> Path | None:
    """The source checkout ferry runs from (src layout), or None for an installed ferry."""
    root = Path(__file__).resolve().parents[3]  # <root>/src/ferry/deploy/_kserve_image.py
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(
        r'(?m)^name\s*=\s*"ferry"', pyproject.read_text(encoding="utf-8")
    ):
        return root
    return None


def build_wheel(dest: Path) -> Path:
    """Build ferry's wheel from its source checkout into ``dest`` (``pip wheel --no-deps``).

    The sources are copied to a temporary folder first, so that the build leaves nothing in the
    checkout (setuptools writes ``build/`` and ``*.egg-info`` beside its sources) and concurrent
    builds do not meet.

    Raises:
        FerryError: ferry is not running from a source checkout, or the build failed.
    """
    root = project_root()
    if root is None:
        raise FerryError(
            "cannot build ferry's wheel: ferry is installed, not running from its source "
            "checkout; pass a ferry wheel (--wheel FILE) or --no-wheel"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ferry-wheel-") as tmp:
        tree = Path(tmp) / "src-tree"
        tree.mkdir()
        for item in root.iterdir():
            if item.is_file() and (
                item.name in ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in")
                or item.name.upper().startswith(("README", "LICENSE", "NOTICE"))
            ):
                shutil.copyfile(item, tree / item.name)
        shutil.copytree(
            root / "src",
            tree / "src",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".*"),
        )
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dest)]
        try:
            import setuptools  # noqa: F401  (present: build here, without fetching it again)

            cmd.append("--no-build-isolation")
        except ImportError:
            pass
        try:
            done = subprocess.run(
                [*cmd, str(tree)], capture_output=True, text=True, timeout=600, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FerryError(f"building ferry's wheel failed: {e}") from e
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise FerryError(f"building ferry's wheel (pip wheel {root}) failed: {tail}")
    wheels = sorted(dest.glob("ferry-*.whl"))
    if len(wheels) != 1:
        raise FerryError(f"building ferry's wheel left {len(wheels)} wheels in {dest}")
    logger.info("built %s", wheels[0])
    return wheels[0]


def check_wheel_file(path: Path) -> Path:
    """``path`` if it is a ferry wheel file, else InvalidInputError."""
    if not path.is_file() or not re.fullmatch(r"ferry-[^-]+-.+\.whl", path.name):
        raise InvalidInputError(
            f"{path} is not a ferry wheel (ferry-VERSION-...whl); make one with "
            "`pip wheel --no-deps -w DIR CHECKOUT`, or leave the wheel out to build it"
        )
    return path


def expected_wheel_name() -> str:
    """The name ``pip wheel`` gives ferry's wheel (a pure-Python wheel of this version)."""
    try:
        from packaging.version import Version

        version = str(Version(__version__))
    except ImportError:
        version = __version__
    return f"ferry-{version.replace('-', '_')}-py3-none-any.whl"


def constraints(extras: list[str]) -> str:
    """Pins (``name==version``) of ferry's dependencies with these extras, as installed here."""
    head = (
        "# The versions of ferry's dependencies installed where this was written (ferry's tests\n"
        "# ran against them); the Dockerfile installs under these constraints.\n"
    )
    try:
        pins = sorted(_installed_closure(extras).items())
    except ImportError:  # no `packaging` to read requirements with: leave the versions free
        logger.warning("cannot read ferry's requirements (no 'packaging'); versions left free")
        pins = []
    return head + "".join(f"{name}=={version}\n" for name, version in pins)


def _installed_closure(extras: list[str]) -> dict[str, str]:
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    queue: list[tuple[str, frozenset[str]]] = [("ferry", frozenset(extras))]
    while queue:
        name, wanted = queue.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = canonicalize_name(dist.metadata["Name"])
        version = dist.version
        if key != "ferry" and "+" not in version:  # a local build (2.1+cpu) is on no index
            pins[key] = version
        for text in dist.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            environments = [{"extra": e} for e in sorted(wanted)] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in environments):
                continue
            queue.append((canonicalize_name(req.name), frozenset(req.extras)))
    return pins


# -- the Dockerfile ---------------------------------------------------------------------------------


def dockerfile_text(
    name: str, command: list[str], wheel_name: str, extras: list[str], *, baked: bool
) -> str:
    """The predictor image's Dockerfile: ferry's wheel with ``extras`` under the constraints, a
    non-root user, the model unless KServe downloads it (``baked``), and ``command`` as CMD."""
    wheel = f"/tmp/ferry/{wheel_name}"
    spec = f"{wheel}[{','.join(extras)}]"
    lines = [
        f"# The predictor image of the KServe InferenceService {name!r}: ferry serve (KServe v2,",
        f"# the Open Inference Protocol) on port {CONTAINER_PORT}. Written by `ferry deploy "
        f"kserve` (ferry {__version__}).",
        "# Build it from this folder: docker build -t IMAGE .   (see README.txt)",
        f"FROM {BASE_IMAGE}",
        "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \\",
        "    PIP_DISABLE_PIP_VERSION_CHECK=1 FERRY_CACHE_DIR=/tmp/ferry-cache",
        f"COPY {CONSTRAINTS_FILE} {WHEEL_DIR}/{wheel_name} /tmp/ferry/",
        f"RUN pip install --constraint /tmp/ferry/{CONSTRAINTS_FILE} {_sh_quote(spec)} \\",
        "    && rm -rf /tmp/ferry",
        f"RUN useradd --uid {USER_ID} --user-group --create-home --home-dir /home/ferry ferry",
    ]
    if baked:
        lines.append(f"COPY {MODEL_DIR}/ {MODEL_MOUNT}/")
    else:
        lines.append(f"# The model is not in the image: KServe downloads it to {MODEL_MOUNT}.")
    lines += [
        f"USER {USER_ID}:{USER_ID}",
        "WORKDIR /home/ferry",
        f"EXPOSE {' '.join(_ports(command))}",
        f"CMD {json.dumps(command)}",
        "",
    ]
    return "\n".join(lines)


def _ports(command: list[str]) -> list[str]:
    """The ports ``ferry serve``'s ``command`` listens on: HTTP's, and gRPC's when it has one."""
    ports = [str(CONTAINER_PORT)]
    if "--grpc-port" in command:
        ports.append(command[command.index("--grpc-port") + 1])
    return ports


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def image_tag(staging: Path) -> str:
    """The image tag: ferry's version and a hash of the build context (what goes into the image),
    so that an image with another model or ferry gets another tag (no stale IfNotPresent pull)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        digest.update(path.relative_to(staging).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    version = re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)
    return f"{version}-{digest.hexdigest()[:12]}"
