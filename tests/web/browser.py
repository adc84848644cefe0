"""A small harness for ferry's web bundle in headless Chromium: serve a folder, open its page, run
the model in it.

The page (``index.html`` of ``ferry export --target web``) keeps a contract on ``window``:

* ``ferryReady``: a Promise, resolved when the model is loaded, rejected with the load error;
* ``ferryRun(feeds)``: ``{name: {data: [...], shape: [...]}}`` in, ``{name: {data, shape,
  dtype}}`` out (a Promise);
* ``ferryBench(feeds, iterations)``: the median latency in ms of ``iterations`` runs (a Promise);
* elements ``#status``, ``#error``, ``#outputs`` and ``#latency`` that a person reads.

The browser is Debian's ``chromium`` driven through Debian's ``chromedriver`` with Selenium
(``scripts/browser-env.sh`` installs them): the two come from one source package, so their
versions always match, and nothing is downloaded at run time (Selenium Manager never runs, since
the driver's path is given). Every wait is bounded; the browser is always quit; the browser's
console log is kept and attached to every failure.

Used by ``tests/web/test_web_browser.py`` and ``benchmarks/web.py``.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import shutil
import socketserver
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

CHROMIUM_ARGS = (
    "--headless=new",
    "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces
    "--disable-gpu",
    "--disable-background-networking",  # nothing outside this machine can be reached anyway
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",  # a container's /dev/shm is small; wasm heaps are not
    "--window-size=1280,1600",  # tall enough that a screenshot shows the whole page
)

#: The headers that make a page cross-origin isolated, which onnxruntime-web needs for threads
#: (SharedArrayBuffer).
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
}


class BrowserError(RuntimeError):
    """Something in the page failed; the message ends with the browser's console log."""


def find_chromium() -> tuple[str, str] | str:
    """``(chromium, chromedriver)`` paths, or a sentence saying what is missing and how to
    install it. ``FERRY_CHROMIUM`` and ``FERRY_CHROMEDRIVER`` override the lookup."""
    chromium = shutil.which(os.environ.get("FERRY_CHROMIUM") or "chromium")
    driver = shutil.which(os.environ.get("FERRY_CHROMEDRIVER") or "chromedriver")
    missing = [n for n, p in (("chromium", chromium), ("chromedriver", driver)) if not p]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (Python)")
    if missing or chromium is None or driver is None:
        return f"{', '.join(missing)} not found: run scripts/browser-env.sh"
    return chromium, driver


# -- a static server -----------------------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves one folder; adds the isolation headers when the server says so."""

    extensions_map = {  # noqa: RUF012  (the base class's attribute, extended)
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".wasm": "application/wasm",
        ".mjs": "text/javascript",
        ".js": "text/javascript",
        ".onnx": "application/octet-stream",
        ".json": "application/json",
    }

    def end_headers(self) -> None:
        if getattr(self.server, "isolate", False):
            for name, value in ISOLATION_HEADERS.items():
                self.send_header(name, value)
        # A second page load (threads off, then on) must not reuse a cached response whose
        # headers belonged to the other server.
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the test's output is for failures, not for every GET


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    isolate = True


@contextlib.contextmanager
def serve_static(folder: Path, *, isolate: bool = True) -> Iterator[str]:
    """Serves ``folder`` on 127.0.0.1 (a free port) in a thread; yields its base URL (ending
    in ``/``). ``isolate`` adds COOP/COEP, without which the page runs single-threaded."""

    def handler(*args: Any, **kwargs: Any) -> _Handler:
        return _Handler(*args, directory=str(folder), **kwargs)

    server = _Server(("127.0.0.1", 0), handler)
    server.isolate = isolate
    thread = threading.Thread(target=server.serve_forever, name="web-static", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- the browser ---------------------------------------------------------------------------------


def _to_js(value: np.ndarray) -> dict[str, Any]:
    """A feed as the page takes it. float32 values go as JSON numbers, which are doubles: exact."""
    return {"data": np.asarray(value).ravel().tolist(), "shape": list(np.shape(value))}


# Typed arrays do not cross WebDriver as arrays (and BigInt not at all): the page's outputs are
# turned into plain arrays of Numbers in the page first.
_RUN = """
const [feeds, done] = [arguments[0], arguments[arguments.length - 1]];
window.ferryRun(feeds).then((out) => {
  const plain = {};
  for (const [name, t] of Object.entries(out)) {
    plain[name] = {data: Array.from(t.data, Number), shape: Array.from(t.shape ?? t.dims, Number),
                   dtype: String(t.dtype ?? t.type)};
  }
  done({ok: plain});
}, (e) => done({error: String((e && e.stack) || e)}));
"""

_BENCH = """
const [feeds, n, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
window.ferryBench(feeds, n).then((ms) => done({ok: Number(ms)}),
                                 (e) => done({error: String((e && e.stack) || e)}));
"""

_READY = """
const done = arguments[arguments.length - 1];
const wait = (t0) => {
  if (window.ferryReady) {
    // What it resolved to, if it is plain data (a session object with methods and cycles is not).
    const plain = (v) => { try { return JSON.parse(JSON.stringify(v ?? null)); } catch { return null; } };
    Promise.resolve(window.ferryReady).then((v) => done({ok: plain(v)}),
      (e) => done({error: String((e && e.message) || e)}));
  } else if (performance.now() - t0 > arguments[0]) {
    done({error: 'the page never set window.ferryReady'});
  } else { setTimeout(() => wait(t0), 50); }
};
wait(performance.now());
"""


class Page:
    """One Chromium with one page open. Use as a context manager (or call :meth:`close`)."""

    def __init__(self, url: str, *, timeout: float = 120.0) -> None:
        """Starts headless Chromium and opens ``url``.

        Args:
            url: The page (``.../index.html``).
            timeout: The bound, in seconds, on any one wait (page load, model load, a run).
        """
        found = find_chromium()
        if isinstance(found, str):
            raise BrowserError(found)
        chromium, driver_path = found
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in CHROMIUM_ARGS:
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.url = url
        self.timeout = timeout
        self._console: list[str] = []
        self._driver: Any = webdriver.Chrome(options=options, service=Service(driver_path))
        try:
            self._driver.set_page_load_timeout(timeout)
            self._driver.set_script_timeout(timeout)
            self._driver.get(url)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Quits the browser (and its chromedriver); safe to call twice."""
        driver, self._driver = getattr(self, "_driver", None), None
        if driver is not None:
            with contextlib.suppress(Exception):
                self._drain_console(driver)
            driver.quit()

    # -- reading the page

    def _drain_console(self, driver: Any = None) -> None:
        driver = driver or self._driver
        if driver is None:
            return
        for entry in driver.get_log("browser"):
            self._console.append(f"[{entry.get('level')}] {entry.get('message')}")

    def console(self) -> list[str]:
        """The browser's console log so far (errors, warnings, the page's own messages)."""
        with contextlib.suppress(Exception):
            self._drain_console()
        return list(self._console)

    def _fail(self, what: str) -> BrowserError:
        log = "\n".join(self.console()[-60:]) or "(empty)"
        return BrowserError(f"{what}\n--- browser console ({self.url}) ---\n{log}")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-like values only)."""
        assert self._driver is not None, "the page is closed"
        return self._driver.execute_script(f"return ({expression});")

    def text(self, element_id: str) -> str:
        """The visible text of the element with that id ('' when there is none)."""
        return str(
            self.evaluate(
                f"(document.getElementById({json.dumps(element_id)}) || {{}}).textContent || ''"
            )
        ).strip()

    def click(self, element_id: str) -> None:
        """Clicks the element with that id, as a person would (it must be visible)."""
        assert self._driver is not None, "the page is closed"
        from selenium.webdriver.common.by import By

        self._driver.find_element(By.ID, element_id).click()

    def upload(self, element_id: str, path: Path) -> None:
        """Chooses ``path`` in the file input with that id (its ``change`` event fires)."""
        assert self._driver is not None, "the page is closed"
        from selenium.webdriver.common.by import By

        self._driver.find_element(By.ID, element_id).send_keys(str(Path(path).resolve()))

    def wait_until(self, expression: str, what: str, timeout: float | None = None) -> Any:
        """Polls a JavaScript expression until it is truthy (bounded by ``timeout``, default the
        page's); gives its value, or raises :class:`BrowserError` naming ``what`` it waited for."""
        end = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > end:
                raise self._fail(f"timed out waiting for {what} ({expression})")
            time.sleep(0.1)

    def evaluate_async(self, expression: str, what: str) -> Any:
        """The value a JavaScript Promise expression resolves to (JSON-like values only);
        a rejection raises :class:`BrowserError` naming ``what`` failed."""
        script = (
            "const done = arguments[arguments.length - 1];"
            f"Promise.resolve().then(() => ({expression})).then((v) => done({{ok: v}}),"
            " (e) => done({error: String((e && e.stack) || e)}));"
        )
        return self._call(script, what=what)

    def _call(self, script: str, *args: Any, what: str) -> Any:
        assert self._driver is not None, "the page is closed"
        from selenium.common.exceptions import WebDriverException

        try:
            result = self._driver.execute_async_script(script, *args)
        except WebDriverException as e:
            raise self._fail(f"{what}: {e.msg or e}") from e
        if not isinstance(result, dict) or "error" in result:
            raise self._fail(
                f"{what}: {result.get('error') if isinstance(result, dict) else result}"
            )
        return result["ok"]

    # -- the contract

    def ready(self) -> Any:
        """Waits for ``window.ferryReady``; gives what it resolved to (as JSON data: ``None``
        for anything else). A rejection (the model could not load) raises
        :class:`BrowserError` with the page's message."""
        return self._call(_READY, self.timeout * 1000, what="window.ferryReady rejected")

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``window.ferryRun`` on these inputs; outputs as arrays of the page's dtype."""
        out = self._call(_RUN, {n: _to_js(v) for n, v in feeds.items()}, what="ferryRun failed")
        return {
            name: np.asarray(t["data"], dtype=_dtype(t["dtype"])).reshape(t["shape"])
            for name, t in out.items()
        }

    def bench(self, feeds: Mapping[str, np.ndarray], iterations: int) -> float:
        """``window.ferryBench``: the median ms of ``iterations`` runs in the page."""
        return float(
            self._call(
                _BENCH,
                {n: _to_js(v) for n, v in feeds.items()},
                int(iterations),
                what="ferryBench failed",
            )
        )

    def workers(self) -> list[str]:
        """The URLs of the page's running web workers, from Chromium's DevTools targets.

        onnxruntime-web's wasm backend runs ``numThreads - 1`` pthread workers beside the page's
        own thread; with none, it ran single-threaded whatever the page asked for.
        """
        assert self._driver is not None, "the page is closed"
        targets = self._driver.execute_cdp_cmd("Target.getTargets", {})["targetInfos"]
        return [t["url"] for t in targets if t.get("type") == "worker"]

    def screenshot(self, path: Path) -> Path:
        """Saves a PNG of the page as it is now."""
        assert self._driver is not None, "the page is closed"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._driver.get_screenshot_as_base64()))
        return path


def _dtype(name: str) -> np.dtype[Any]:
    """numpy's dtype for onnxruntime-web's tensor type names ('float32', 'int64', 'bool'...)."""
    return np.dtype({"bool": "bool", "float16": "float16"}.get(name, name))
