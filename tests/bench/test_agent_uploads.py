"""Hostile uploads to the bench agent: archives built in code (zip and tar alike) that try to
write outside the job's folder, through links, onto devices, over one another, or to fill the
disk, and archives that are empty, broken or hold no model. Each is refused with 400 (413 for
one over the size limit) naming the member at fault, nothing lands outside the agent's work
folder, and the job folder is gone. Harmless archives (a folder of folders, external data in a
subfolder, inputs) still run."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import tempfile
import time
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import models  # noqa: E402
from ferry.bench import BenchSpec, _agent, _agent_upload  # noqa: E402
from ferry.serving import HTTPError, ServerThread  # noqa: E402

TOKEN = "agent-s3cret"
LIMIT = 200_000  # bytes: the agent's upload limit here (the MLP is ~1 KB)
BIG_LIMIT = 64 << 20  # for the ratio checks, which start past 1 MiB unpacked
SPEC = BenchSpec(iterations=3, warmup=0, isolate=False)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = models.mlp().SerializeToString()


@pytest.fixture
def job_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir the agent makes job folders in: ``tmp_path/work/agent-tmp``, so that a
    member escaping a job folder (``job/model/../../..``) lands in ``tmp_path/work``, and one
    going further in ``tmp_path``: both are watched by :func:`_nothing_escaped`."""
    folder = tmp_path / "work" / "agent-tmp"
    folder.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _agent_at(limit: int) -> Callable[[Path], Iterator[ServerThread]]:
    def fixture(job_tmp: Path) -> Iterator[ServerThread]:
        running = ServerThread(create(limit), port=0)
        running.start()
        try:
            yield running
        finally:
            running.stop()
        assert not running.is_alive()

    return fixture


def create(limit: int) -> Any:
    return _agent.create_agent_app(TOKEN, max_upload_bytes=limit, max_queue=4)


agent = pytest.fixture(_agent_at(LIMIT), name="agent")
big_agent = pytest.fixture(_agent_at(BIG_LIMIT), name="big_agent")


def _post(agent: ServerThread, body: bytes) -> Any:
    headers = {**AUTH, "X-Ferry-Spec": json.dumps(SPEC.to_dict())}
    return httpx.post(f"{agent.url}/jobs", content=body, headers=headers, timeout=60)


def _wait(agent: ServerThread, job: str, limit_s: float = 60) -> Any:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        r = httpx.get(f"{agent.url}/jobs/{job}?wait=5", headers=AUTH, timeout=30)
        if r.json()["status"] in ("done", "failed"):
            return r
    raise AssertionError(f"job {job} did not finish in {limit_s} s")


def _nothing_escaped(tmp_path: Path, job_tmp: Path) -> None:
    """No file of the archive's anywhere outside the job folders, and no job folder left."""
    assert list(job_tmp.iterdir()) == []
    planted = {"secret.bin", "victim"}  # the tests' own targets
    stray = [
        p
        for p in tmp_path.rglob("*")
        if not p.is_relative_to(job_tmp) and p.is_file() and p.name not in planted
    ]
    assert stray == []


def _refused(agent: ServerThread, body: bytes, status: int, *needles: str) -> str:
    r = _post(agent, body)
    assert r.status_code == status, r.text
    message = r.json()["error"]
    for needle in needles:
        assert needle in message, message
    assert "Traceback" not in message
    return message


# Building archives: (name, kind, payload) members, kind one of "file", "dir", "symlink",
# "hardlink", "chardev", "blockdev", "fifo"; a link's payload is its target.


def _tar(members: list[tuple[str, str, Any]], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.mode = 0o755 if kind == "dir" else 0o644
            data = None
            if kind == "file":
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
            else:
                info.type = {
                    "dir": tarfile.DIRTYPE,
                    "symlink": tarfile.SYMTYPE,
                    "hardlink": tarfile.LNKTYPE,
                    "chardev": tarfile.CHRTYPE,
                    "blockdev": tarfile.BLKTYPE,
                    "fifo": tarfile.FIFOTYPE,
                }[kind]
                if kind in ("symlink", "hardlink"):
                    info.linkname = payload
                if kind in ("chardev", "blockdev"):
                    info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


_ZIP_MODES = {
    "file": 0o100644,
    "dir": 0o040755,
    "symlink": 0o120777,
    "chardev": 0o020644,
    "blockdev": 0o060644,
    "fifo": 0o010644,
}


def _zip(members: list[tuple[str, str, Any]], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w", compression=method) as zf:
        warnings.simplefilter("ignore")  # a duplicate name warns; writing one is the point here
        for name, kind, payload in members:
            info = zipfile.ZipInfo(name if kind != "dir" or name.endswith("/") else name + "/")
            info.create_system = 3  # Unix: the mode bits below mean what they say
            info.external_attr = _ZIP_MODES[kind] << 16
            info.compress_type = method
            data = payload if isinstance(payload, bytes) else str(payload or "").encode()
            zf.writestr(info, b"" if kind == "dir" else data)
    return buf.getvalue()


def _both(members: list[tuple[str, str, Any]]) -> list[tuple[str, bytes]]:
    """The same members as a tar, a tar.gz and (where zip can say it) a zip."""
    built = [("tar", _tar(members)), ("tar.gz", _tar(members, gz=True))]
    if all(kind != "hardlink" for _, kind, _ in members):  # zip has no hard links
        built.append(("zip", _zip(members)))
    return built


# --- Paths that lead out ------------------------------------------------------------------


def _escapes(tmp_path: Path) -> list[str]:
    # The job unpacks into work/agent-tmp/<job>/model/: three ".." reach work/, four tmp_path.
    return [
        "../evil.onnx",
        "../../../evil.onnx",
        "../../../../evil.onnx",
        "model/../../../../../evil.onnx",
        "./../../../../evil.onnx",
        str(tmp_path / "evil-absolute.onnx"),
        "/tmp/ferry-agent-evil.onnx",
        "//evil.onnx",
        "..\\..\\..\\..\\evil.onnx",
        "model\\..\\..\\..\\evil.onnx",
        "C:\\evil.onnx",
        "C:evil.onnx",
        "folder/C:evil.onnx",
        "",
    ]


def test_paths_that_lead_out_are_refused(
    agent: ServerThread, tmp_path: Path, job_tmp: Path
) -> None:
    for name in _escapes(tmp_path):
        # A harmless model first: the refusal must come before or after writing it, never let
        # the evil member through.
        members = [("model.onnx", "file", MODEL), (name, "file", MODEL)]
        for form, body in _both(members):
            if form == "zip" and not name:
                continue  # zip cannot write a nameless member
            message = _refused(agent, body, 400, "unsafe path", repr(name))
            assert "relative" in message, (form, message)
        _nothing_escaped(tmp_path, job_tmp)
    assert not Path("/tmp/ferry-agent-evil.onnx").exists()


def test_links_out_and_writes_through_them_are_refused(
    agent: ServerThread, tmp_path: Path, job_tmp: Path
) -> None:
    victim = tmp_path / "victim"  # what the links point at; it must stay as it is
    victim.write_text("keep me", encoding="utf-8")
    cases: list[list[tuple[str, str, Any]]] = [
        [("model.onnx", "symlink", "/etc/passwd")],
        [("model.onnx", "symlink", str(victim))],
        [("model.onnx", "file", MODEL), ("weights.data", "symlink", "../../../../victim")],
        # A link to a folder outside, then a file written through it.
        [("out", "symlink", str(tmp_path)), ("out/evil.onnx", "file", MODEL)],
        [("out", "symlink", "../../../.."), ("out/evil.onnx", "file", MODEL)],
        [("model.onnx", "hardlink", str(victim))],
        [("model.onnx", "hardlink", "../../../../victim")],
        # A hard link to an earlier member, then a write that would go through it.
        [("model.onnx", "file", MODEL), ("again.onnx", "hardlink", "model.onnx")],
    ]
    for members in cases:
        name, kind, target = next(m for m in members if m[1] in ("symlink", "hardlink"))
        for form, body in _both(members):
            what = "symbolic link" if kind == "symlink" else "hard link"
            message = _refused(agent, body, 400, "not a plain file", repr(name), what)
            if form != "zip":  # tar names the target; zip keeps it as the member's data
                assert repr(target) in message
    assert victim.read_text(encoding="utf-8") == "keep me"
    _nothing_escaped(tmp_path, job_tmp)


def test_devices_and_fifos_are_refused(agent: ServerThread, tmp_path: Path, job_tmp: Path) -> None:
    for kind, what in (
        ("chardev", "character device"),
        ("blockdev", "block device"),
        ("fifo", "FIFO"),
    ):
        members = [("model.onnx", "file", MODEL), (f"dev-{kind}", kind, None)]
        for _, body in _both(members):
            _refused(agent, body, 400, "not a plain file", repr(f"dev-{kind}"), what)
    # A GNU sparse file: holes that unpack to zeros nobody sent.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("model.onnx")
        info.type, info.size = tarfile.GNUTYPE_SPARSE, 0
        tar.addfile(info)
    _refused(agent, buf.getvalue(), 400, "'model.onnx'", "sparse file")
    _nothing_escaped(tmp_path, job_tmp)


def test_duplicate_names_are_refused(agent: ServerThread, tmp_path: Path, job_tmp: Path) -> None:
    cases = [
        ([("model.onnx", "file", MODEL), ("model.onnx", "file", b"garbage")], "'model.onnx'"),
        ([("model.onnx", "file", MODEL), ("./model.onnx", "file", MODEL)], "'./model.onnx'"),
        ([("model.onnx", "file", MODEL), ("Model.onnx", "file", MODEL)], "'Model.onnx'"),
        ([("a/model.onnx", "file", MODEL), ("a/b/../model.onnx", "file", MODEL)], "'a/b/.."),
    ]
    for members, needle in cases:
        for _, body in _both(members):
            _refused(agent, body, 400, needle)
    # A file, then the same name as a folder (or inside it), and the other way round.
    for members, needle in (
        ([("model.onnx", "file", MODEL), ("x", "file", b"1"), ("x/y", "file", b"2")], "'x/y'"),
        ([("model.onnx", "file", MODEL), ("x/y", "file", b"2"), ("x", "file", b"1")], "'x'"),
        ([("model.onnx", "file", MODEL), ("x", "dir", None), ("x", "file", b"1")], "'x'"),
    ):
        for _, body in _both(members):
            message = _refused(agent, body, 400, needle)
            assert "file" in message and ("folder" in message or "inside" in message), message
    # The same folder twice is harmless (some tools write it so).
    members = [("m/", "dir", None), ("m/", "dir", None), ("m/model.onnx", "file", MODEL)]
    for _, body in _both(members):
        r = _post(agent, body)
        assert r.status_code == 202, r.text
        assert _wait(agent, r.json()["id"]).status_code == 200
    _nothing_escaped(tmp_path, job_tmp)


# --- Bombs and sizes -------------------------------------------------------------------------


def test_archives_over_the_size_limit_name_the_member(
    agent: ServerThread, tmp_path: Path, job_tmp: Path
) -> None:
    # One member over the limit, and many small ones over it together.
    one = [("model.onnx", "file", MODEL), ("zeros.bin", "file", bytes(LIMIT + 1))]
    many = [("model.onnx", "file", MODEL)] + [
        (f"part{i}.bin", "file", bytes(LIMIT // 4)) for i in range(5)
    ]
    for members, needle in ((one, "'zeros.bin'"), (many, "'part3.bin'")):
        for form, body in _both(members):
            if form == "tar":
                continue  # a plain tar this big is refused as an upload before it unpacks
            _refused(agent, body, 413, "unpacked", needle, "--max-upload-mb")
    _nothing_escaped(tmp_path, job_tmp)


def test_compression_bombs_are_refused(
    big_agent: ServerThread, tmp_path: Path, job_tmp: Path
) -> None:
    zeros = bytes(16 << 20)  # 16 MiB of zeros: under the limit, but 1000 times its gzip
    members = [("model.onnx", "file", MODEL), ("bomb.data", "file", zeros)]
    for form, body in _both(members):
        if form == "tar":
            continue  # uncompressed: no bomb
        assert len(body) < 100_000
        message = _refused(big_agent, body, 400, "'bomb.data'", "100 times", "uncompressed")
        assert "decompression bomb" in message
    # bzip2 squeezes zeros a thousand times harder.
    _refused(big_agent, _zip(members, zipfile.ZIP_BZIP2), 400, "'bomb.data'", "100 times")
    # Uncompressed, the same bytes are merely large, and fine.
    r = _post(big_agent, _tar(members))
    assert r.status_code == 202, r.text
    assert _wait(big_agent, r.json()["id"]).status_code == 200
    _nothing_escaped(tmp_path, job_tmp)


def test_a_zip_whose_sizes_lie_unpacks_no_more_than_it_declares(
    big_agent: ServerThread, tmp_path: Path, job_tmp: Path
) -> None:
    """The directory says 1000 bytes (with their CRC); the deflate stream holds 16 MiB. zipfile
    stops at the declared size, so 1000 bytes are written and the job runs; the agent's own count
    of the bytes written (the next test) would stop a reader that did not."""
    body = bytearray(_zip([("model.onnx", "file", MODEL), ("bomb.data", "file", bytes(16 << 20))]))
    crc = zlib.crc32(bytes(1000)).to_bytes(4, "little")
    small = (1000).to_bytes(4, "little")
    for signature, crc_at, size_at in ((b"PK\x03\x04", 14, 22), (b"PK\x01\x02", 16, 24)):
        pos = body.index(signature, body.index(signature) + 1)  # the second member's headers
        body[pos + crc_at : pos + crc_at + 4] = crc
        body[pos + size_at : pos + size_at + 4] = small
    r = _post(big_agent, bytes(body))
    assert r.status_code == 202, r.text
    assert _wait(big_agent, r.json()["id"]).status_code == 200
    _nothing_escaped(tmp_path, job_tmp)


def test_bytes_written_count_not_the_declared_size(tmp_path: Path) -> None:
    """A member that streams more than it declared is cut off by what was written."""
    dest = tmp_path / "dest"
    dest.mkdir()
    unpacker = _agent_upload._Unpacker(dest, limit=10_000, packed=5_000, max_ratio=100)
    path = unpacker.admit("liar.bin", is_dir=False)
    assert path is not None
    unpacker.declare("liar.bin", 10, None)
    with pytest.raises(HTTPError, match="'liar.bin'") as caught:
        unpacker.write("liar.bin", path, io.BytesIO(bytes(20_000)), None)
    assert caught.value.status == 413
    # And a member far above its compressed size, once past the ratio's floor.
    unpacker = _agent_upload._Unpacker(dest, limit=64 << 20, packed=10 << 20, max_ratio=100)
    path = unpacker.admit("swollen.bin", is_dir=False)
    assert path is not None
    with pytest.raises(HTTPError, match="'swollen.bin' unpacks to over 100 times") as caught:
        unpacker.write("swollen.bin", path, io.BytesIO(bytes(3 << 20)), 1000)
    assert caught.value.status == 400


def test_too_many_members(
    agent: ServerThread, tmp_path: Path, job_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_agent_upload, "_MAX_MEMBERS", 20)
    members = [("model.onnx", "file", MODEL)] + [(f"f{i}", "file", b"x") for i in range(20)]
    for _, body in _both(members):
        _refused(agent, body, 400, "over 20 entries")
    _nothing_escaped(tmp_path, job_tmp)


# --- Empty, broken, unreadable, no model ------------------------------------------------------


def test_empty_broken_and_modelless_archives(
    agent: ServerThread, tmp_path: Path, job_tmp: Path
) -> None:
    for body in (_zip([]), _tar([]), _tar([], gz=True)):
        _refused(agent, body, 400, "archive is empty")
    for members in ([("readme.txt", "file", b"hi")], [("a/", "dir", None), ("b/", "dir", None)]):
        for _, body in _both(members):
            _refused(agent, body, 400, "no model.onnx")
    members = [("model.onnx", "file", MODEL), ("pad.bin", "file", os.urandom(20_000))]
    zipped, tarred, gzipped = _zip(members), _tar(members), _tar(members, gz=True)
    for cut in (0.3, 0.6, 0.95):
        _refused(agent, zipped[: int(len(zipped) * cut)], 400, "not a readable zip")
        _refused(agent, gzipped[: int(len(gzipped) * cut)], 400, "not a readable tar")
    _refused(agent, tarred[: len(tarred) // 2], 400, "not a readable tar", "truncated")
    # Bytes flipped inside a deflate stream: a CRC or zlib error, not a crash.
    corrupt = bytearray(zipped)
    start = corrupt.index(b"pad.bin") + len("pad.bin") + 100
    corrupt[start : start + 64] = bytes(b ^ 0xFF for b in corrupt[start : start + 64])
    _refused(agent, bytes(corrupt), 400, "not a readable zip")
    corrupt = bytearray(gzipped)
    corrupt[len(corrupt) // 2 : len(corrupt) // 2 + 64] = bytes(64)
    _refused(agent, bytes(corrupt), 400, "not a readable tar")
    _refused(agent, gzip.compress(b"not a tar"), 400, "not a readable tar")
    # A local header whose name differs from the directory's (a reader that trusts the header
    # would write ../evil.on).
    forked = bytearray(zipped)
    pos = forked.index(b"PK\x03\x04") + 30
    assert forked[pos : pos + 10] == b"model.onnx"
    forked[pos : pos + 10] = b"../evil.on"
    _refused(agent, bytes(forked), 400, "not a readable zip", "'../evil.on'")
    # An encrypted member, and a compression method zipfile does not know.
    encrypted = bytearray(_zip(members, zipfile.ZIP_STORED))
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        for pos in _all(encrypted, signature):
            encrypted[pos + flags_at] |= 0x1
    _refused(agent, bytes(encrypted), 400, "'model.onnx' is encrypted")
    odd = bytearray(_zip(members, zipfile.ZIP_STORED))
    for signature, method_at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        for pos in _all(odd, signature):
            odd[pos + method_at : pos + method_at + 2] = (99).to_bytes(2, "little")
    _refused(agent, bytes(odd), 400, "'model.onnx' is compressed with method 99")
    _nothing_escaped(tmp_path, job_tmp)


def _all(data: bytearray, signature: bytes) -> list[int]:
    found, pos = [], data.find(signature)
    while pos >= 0:
        found.append(pos)
        pos = data.find(signature, pos + 1)
    return found


def test_external_data_outside_the_upload_is_refused(
    agent: ServerThread, tmp_path: Path, job_tmp: Path
) -> None:
    secret = tmp_path / "secret.bin"  # a file of the device's that the model wants as weights
    secret.write_bytes(bytes(range(32)) * 40)
    for location in ("../../../../secret.bin", str(secret)):
        model = models.mlp()
        weight = model.graph.initializer[0]  # w1: 8 x 16 floats, 512 bytes
        weight.ClearField("raw_data")
        weight.ClearField("float_data")
        weight.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", "512")):
            entry = weight.external_data.add()
            entry.key, entry.value = key, value
        data = model.SerializeToString()
        for _, body in [("onnx", data), *_both([("model.onnx", "file", data)])]:
            _refused(agent, body, 400, "weight 'w1'", repr(location), "outside its folder")
    _nothing_escaped(tmp_path, job_tmp)


# --- What must still work -------------------------------------------------------------------


def _artifact_members() -> list[tuple[str, str, Any]]:
    """An artifact folder: model.onnx with its weights in weights/mlp.data, and inputs."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "weights").mkdir()
        onnx.save(
            models.mlp(),
            folder / "model.onnx",
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="weights/mlp.data",
            size_threshold=0,
        )
        x = io.BytesIO()
        np.save(x, np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32))
        return [
            ("model.onnx", "file", (folder / "model.onnx").read_bytes()),
            ("weights/", "dir", None),
            ("weights/mlp.data", "file", (folder / "weights" / "mlp.data").read_bytes()),
            ("bench-inputs/", "dir", None),
            ("bench-inputs/names.json", "file", json.dumps({"x.npy": "x"})),
            ("bench-inputs/x.npy", "file", x.getvalue()),
        ]


def test_harmless_archives_still_run(agent: ServerThread, tmp_path: Path, job_tmp: Path) -> None:
    members = _artifact_members()
    layouts = {
        "at the top": members,
        "in one folder": [("my-model/", "dir", None)]
        + [(f"my-model/{n}", k, p) for n, k, p in members],
        "as tar -C folder . writes it": [("./", "dir", None)]
        + [(f"./{n}", k, p) for n, k, p in members],
        "with no folder entries": [m for m in members if m[1] != "dir"],
    }
    for layout, entries in layouts.items():
        for form, body in _both(entries):
            r = _post(agent, body)
            assert r.status_code == 202, (layout, form, r.text)
            done = _wait(agent, r.json()["id"])
            assert done.status_code == 200, (layout, form, done.text)
            result = done.json()["result"]
            assert result["settings"]["inputs_from"] == {"x": "file"}, (layout, form)
            assert result["configurations"][0]["error"] is None
    _nothing_escaped(tmp_path, job_tmp)
