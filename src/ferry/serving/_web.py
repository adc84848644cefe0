"""Web bundles (``ferry export --target web``) served at ``/web/<model>/``.

Where a bundle comes from, first match wins:

1. ``create_app(..., web={name: folder})`` (``ferry serve --web [NAME=]DIR``): a bundle folder
   under that name; a folder of bundles mounts each under its folder name.
2. The served model itself: a repository model folder holding ``web/`` (``REPO/mlp/web/``, next
   to its version folders), or a single artifact folder that *is* a bundle or holds ``web/``
   (``ferry serve site/`` serves the bundle's model over KServe and its page at ``/web/site/``).

Files go out with the MIME types browsers insist on for modules and wasm (``text/javascript``,
``application/wasm``) and with the cross-origin isolation headers (COOP ``same-origin``, COEP
``require-corp``, CORP ``same-origin``): without them a page has no SharedArrayBuffer and
onnxruntime-web runs on one thread. Only plain files inside the bundle are served: ``..``, hidden
names and links that lead outside are refused with 404. The page is static content, as on any
static host: the API key guards inference and the repository, not ``/web/``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.errors import InvalidInputError

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ferry.serving._repository import ModelRepository

__all__ = ["ISOLATION_HEADERS", "WebBundles", "media_type", "parse_web_mounts"]

#: Sent with every bundle file: they make the page cross-origin isolated (threads).
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
}

_MEDIA_TYPES = {
    ".wasm": "application/wasm",
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".html": "text/html; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".css": "text/css",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".svg": "image/svg+xml",
}


def media_type(name: str) -> str:
    """The Content-Type a bundle file is served with (models and the rest: octet-stream)."""
    return _MEDIA_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")


def _is_bundle(folder: Path) -> bool:
    from ferry.web import is_bundle

    return folder.is_dir() and is_bundle(folder)


def parse_web_mounts(items: Iterable[str | os.PathLike[str]]) -> dict[str, Path]:
    """``[NAME=]DIR`` items (``--web``) -> ``{name: bundle folder}``.

    Raises:
        InvalidInputError: a folder that is neither a bundle nor holds any, a bad name, or one
            name given twice.
    """
    from ferry.serving._repository import check_model_name, model_name_for

    mounts: dict[str, Path] = {}
    for item in items:
        text = os.fspath(item)
        name, sep, folder = text.partition("=")
        path = Path(folder if sep else text)
        if _is_bundle(path):
            found = {check_model_name(name) if sep else model_name_for(path): path}
        elif path.is_dir() and not sep:
            found = {c.name: c for c in sorted(path.iterdir()) if _is_bundle(c)}
            if not found:
                raise InvalidInputError(
                    f"{path} is no web bundle and holds none; make one with "
                    "`ferry export MODEL --target web -o DIR`"
                )
        else:
            raise InvalidInputError(
                f"{path} is no web bundle (no manifest.json of `ferry export --target web`)"
            )
        for key, value in found.items():
            if key in mounts:
                raise InvalidInputError(f"two web bundles named {key!r}: {mounts[key]} and {value}")
            mounts[key] = value
    return mounts


class WebBundles:
    """Finds a model's bundle and answers ``GET /web/<model>/<path>``."""

    def __init__(self, repository: ModelRepository, mounts: Mapping[str, Path]) -> None:
        self.repository = repository
        self.mounts = dict(mounts)

    def find(self, name: str) -> Path | None:
        """The bundle folder served as ``name``, or None."""
        if name in self.mounts:
            return self.mounts[name]
        repo = self.repository
        candidates: list[Path] = []
        if repo.single is not None and repo.single[0] == name and repo.single[1].is_dir():
            candidates = [repo.single[1], repo.single[1] / "web"]
        elif repo.root is not None and not name.startswith("."):
            candidates = [repo.root / name / "web"]
        return next((c for c in candidates if _is_bundle(c)), None)

    async def endpoint(self, request: Request) -> Response:
        from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse

        name = request.path_params["model"]
        rest = request.path_params.get("path", None)
        bundle = self.find(name)
        if bundle is None:
            return PlainTextResponse(f"no web bundle for model {name!r}", status_code=404)
        if rest is None:
            # /web/NAME -> /web/NAME/: the page's relative URLs resolve inside the bundle.
            return RedirectResponse(f"/web/{name}/", status_code=308)
        file = _safe_file(bundle, rest or "index.html")
        if file is None:
            return PlainTextResponse(f"not found: /web/{name}/{rest}", status_code=404)
        headers: dict[str, Any] = {**ISOLATION_HEADERS, "Cache-Control": "no-cache"}
        return FileResponse(file, media_type=media_type(file.name), headers=headers)


def _safe_file(bundle: Path, rest: str) -> Path | None:
    """``bundle/rest`` if it is a plain file inside ``bundle``; None for anything else."""
    parts = rest.split("/")
    if rest.startswith("/") or "\\" in rest or "\x00" in rest:
        return None
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        return None
    root = bundle.resolve()
    target = (root / rest).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        return None
    return target
