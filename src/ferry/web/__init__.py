"""The browser: a static bundle on onnxruntime-web (``ferry export --target web``).

:func:`export_web` writes a folder any static host (or ``ferry serve --web``) serves: the model,
onnxruntime-web's runtime files from a pinned npm release, ``ferry.js`` (``load(url)`` ->
session with ``inputs``, ``outputs``, ``run(feeds)``) and an ``index.html`` that runs the model
and shows its outputs and latency. :func:`check_web_ops` is the ops check it makes first, from
what the wasm build was measured to run; :func:`run_bundle_in_node` runs a bundle through its
own files in Node (the export's verification). :func:`export_chat` does it for a generative
artifact: a chat page whose token loop, tokenizer and chat template run in JavaScript.
"""

from __future__ import annotations

from ferry.web._chat import ChatExport, export_chat, run_chat_in_node
from ferry.web._export import BUNDLE_FORMAT, WebExport, export_web, is_bundle, run_bundle_in_node
from ferry.web._npm import PINNED_ORT_WEB_VERSION, ensure_onnxruntime_web, npm_cache_dir
from ferry.web._ops import WebOpsCheck, check_web_ops

__all__ = [
    "BUNDLE_FORMAT",
    "PINNED_ORT_WEB_VERSION",
    "ChatExport",
    "WebExport",
    "WebOpsCheck",
    "check_web_ops",
    "ensure_onnxruntime_web",
    "export_chat",
    "export_web",
    "is_bundle",
    "npm_cache_dir",
    "run_bundle_in_node",
    "run_chat_in_node",
]
