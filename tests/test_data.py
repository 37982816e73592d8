"""download.py's verified, atomic downloads from mirrors, and MNIST's files: their download,
IDX decoding and preparation."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import requests

from accelbench.core.console import InputError
from accelbench.data import mnist
from accelbench.data.datasets import DATASETS
from accelbench.data.download import (
    DownloadError,
    download_file,
    mirrors_with_override,
    remove_leftovers,
)
from accelbench.data.prepared import MANIFEST, load_split, prepare
from helpers import idx_bytes

STEM = "train-labels-idx1-ubyte"
NAME = f"{STEM}.gz"


def _download(name: str, sha: str, out: Path, mirrors: list[str], **limits) -> Path:
    """One MNIST file, checked as MNIST's download checks it."""

    def check(path: Path) -> None:
        mnist.check_gz(path, sha)

    return download_file(name, check, out, mirrors, variable=mnist.MIRROR_ENV, **limits)


def _prepare(raw: Path, out: Path, checksums: dict[str, str] | None = mnist.FILES) -> dict:
    return prepare(
        out, DATASETS["mnist"], lambda folder: mnist.prepare_into(raw, folder, checksums)
    )


class _Handler(http.server.BaseHTTPRequestHandler):
    files: ClassVar[dict[str, bytes]] = {}
    lie_about_length: ClassVar[set[str]] = set()
    drip: ClassVar[set[str]] = set()  # one byte every 0.2 s: each read is quick, the file never
    gzip_encoding: ClassVar[set[str]] = set()  # the .gz sent with Content-Encoding: gzip

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        mirror = self.path.strip("/").split("/", 1)[0]
        body = self.files.get(f"{mirror}/{name}")
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        claimed = len(body) + 1000 if f"{mirror}/{name}" in self.lie_about_length else len(body)
        self.send_header("Content-Length", str(claimed))
        if f"{mirror}/{name}" in self.gzip_encoding:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.close_connection = True
        if f"{mirror}/{name}" in self.drip:
            try:
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:  # the client gave up
                pass
            return
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type(
        "Handler",
        (_Handler,),
        {"files": {}, "lie_about_length": set(), "drip": set(), "gzip_encoding": set()},
    )
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def payload() -> tuple[bytes, str]:
    labels = np.arange(100, dtype=np.uint8) % 10
    raw = idx_bytes(labels, mnist.LABELS_MAGIC)
    return raw, hashlib.sha256(raw).hexdigest()


def _only_final_file(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_http_download_verifies_and_accepts_recompressed_copy(server, payload, tmp_path) -> None:
    url, handler = server
    raw, sha = payload
    handler.files[f"good/{STEM}.gz"] = gzip.compress(raw, compresslevel=1)  # not the canonical .gz
    out = tmp_path / "raw"
    path = _download(NAME, sha, out, [f"{url}/good"], timeout_s=5, retries=0)
    assert path == out / f"{STEM}.gz"
    assert gzip.decompress(path.read_bytes()) == raw
    assert _only_final_file(out) == [f"{STEM}.gz"]


def test_corrupt_then_truncated_then_good_mirror(server, payload, tmp_path) -> None:
    url, handler = server
    raw, sha = payload
    corrupt = bytearray(raw)
    corrupt[-1] ^= 0xFF
    handler.files[f"corrupt/{STEM}.gz"] = gzip.compress(bytes(corrupt))
    handler.files[f"truncated/{STEM}.gz"] = gzip.compress(raw)[:-12]
    handler.files[f"good/{STEM}.gz"] = gzip.compress(raw)
    mirrors = [f"{url}/corrupt", f"{url}/truncated", f"{url}/missing", f"{url}/good"]
    path = _download(NAME, sha, tmp_path, mirrors, timeout_s=5, retries=0)
    assert gzip.decompress(path.read_bytes()) == raw


def test_all_mirrors_fail_leaves_nothing_and_names_each_mirror(server, payload, tmp_path) -> None:
    url, handler = server
    raw, sha = payload
    handler.files[f"short/{STEM}.gz"] = gzip.compress(raw)
    handler.lie_about_length.add(f"short/{STEM}.gz")  # connection closes before Content-Length
    handler.files[f"corrupt/{STEM}.gz"] = b"not gzip at all"
    local = tmp_path / "empty-folder"
    local.mkdir()
    mirrors = [f"{url}/short", f"{url}/corrupt", f"{url}/missing", str(local)]
    out = tmp_path / "raw"
    with pytest.raises(DownloadError) as info:
        _download(NAME, sha, out, mirrors, timeout_s=5, retries=0)
    message = str(info.value)
    for mirror in mirrors:
        assert mirror in message
    assert "404" in message
    assert "not a complete gzip file" in message
    assert "does not exist" in message
    assert mnist.MIRROR_ENV in message
    assert _only_final_file(out) == []  # no final file, no leftover temporary file


def test_existing_good_file_is_not_replaced_by_a_failed_download(server, payload, tmp_path) -> None:
    url, handler = server
    raw, sha = payload
    handler.files[f"corrupt/{STEM}.gz"] = gzip.compress(raw[:-1])
    with pytest.raises(DownloadError):
        _download(NAME, sha, tmp_path, [f"{url}/corrupt"], timeout_s=5, retries=0)
    assert not (tmp_path / f"{STEM}.gz").exists()


def test_a_verified_file_already_there_is_kept_and_nothing_is_fetched(
    server, payload, tmp_path, capsys
) -> None:
    """DVC keeps data/raw when download re-runs: a file that verifies needs no mirror, so a
    re-run offline, or with every mirror failing, keeps it and succeeds."""
    url, handler = server
    raw, sha = payload
    handler.files[f"good/{STEM}.gz"] = gzip.compress(raw)
    first = _download(NAME, sha, tmp_path, [f"{url}/good"], timeout_s=5, retries=0)
    before = first.stat()
    handler.files.clear()  # every mirror fails now
    again = _download(NAME, sha, tmp_path, [f"{url}/good", f"{url}/gone"], timeout_s=5, retries=0)
    assert again == first and again.stat().st_ino == before.st_ino
    assert gzip.decompress(again.read_bytes()) == raw
    assert f"{STEM}.gz verified, here already: nothing fetched" in capsys.readouterr().err
    assert _only_final_file(tmp_path) == [f"{STEM}.gz"]


def test_local_folder_and_file_url_mirrors(fake_mnist, tmp_path) -> None:
    mirror, checksums = fake_mnist
    for spec in (str(mirror), mirror.as_uri()):
        out = tmp_path / "out" / spec[:4]
        stem = "t10k-labels-idx1-ubyte"
        _download(f"{stem}.gz", checksums[stem], out, [spec])
        assert (out / f"{stem}.gz").is_file()


def test_closed_port_fails_fast_with_reason(payload, tmp_path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, sha = payload
    mirrors = [f"http://127.0.0.1:{port}/{'long-path/' * 12}{i}" for i in range(3)]
    with pytest.raises(DownloadError, match="ConnectionError") as info:
        _download(NAME, sha, tmp_path, mirrors, timeout_s=2, retries=1)
    message = str(info.value)
    # The way out comes before the failures: the CLI cuts an error line at 500 characters.
    assert message.index(mnist.MIRROR_ENV) < 250 and "docs/air-gapped.md" in message[:400]
    # Each failure is urllib3's innermost reason, not requests' wrappers quoting the URL again.
    assert message.count("Connection refused") == 3 and "HTTPConnectionPool" not in message


def test_a_mirror_failure_is_said_by_its_innermost_reason() -> None:
    """requests and urllib3 wrap the reason in the connection and the URL, twice; a connect
    timeout's reason is the second of its (connection, message) pair."""
    import urllib3
    from urllib3.connection import HTTPSConnection

    from accelbench.data.download import _reason

    def wrapped(error: Exception, kind: type[requests.RequestException]) -> Exception:
        pool = urllib3.HTTPSConnectionPool("[::1]", 443)
        return kind(urllib3.exceptions.MaxRetryError(pool, "/mnist/x.gz", error))

    conn = HTTPSConnection("ossci-datasets.s3.amazonaws.com", 443)
    timeout = urllib3.exceptions.ConnectTimeoutError(
        conn, "Connection to ossci-datasets.s3.amazonaws.com timed out. (connect timeout=30)"
    )
    assert _reason(wrapped(timeout, requests.ConnectTimeout)) == (
        "ConnectTimeout, ConnectTimeoutError: Connection to ossci-datasets.s3.amazonaws.com "
        "timed out. (connect timeout=30)"
    )
    ipv6 = HTTPSConnection("::1", 8443)
    refused = urllib3.exceptions.NewConnectionError(ipv6, "Failed to establish a new connection")
    reason = _reason(wrapped(refused, requests.ConnectionError))
    assert reason.endswith("Failed to establish a new connection"), reason
    assert _reason(OSError("disk full")) == "OSError: disk full"
    assert _reason(requests.HTTPError("404 Client Error")) == "HTTPError: 404 Client Error"


def test_environment_mirror_goes_first(tmp_path) -> None:
    mirrors = ["https://a/", "https://b/"]
    variable = mnist.MIRROR_ENV
    assert mirrors_with_override(mirrors, variable, "x", {}) == mirrors
    env = {variable: str(tmp_path)}
    assert mirrors_with_override(mirrors, variable, "x", env) == [str(tmp_path), *mirrors]
    env = {variable: tmp_path.as_uri()}
    assert mirrors_with_override(mirrors, variable, "x", env) == [tmp_path.as_uri(), *mirrors]
    env = {variable: "https://b/"}
    assert mirrors_with_override(mirrors, variable, "x", env) == ["https://b/", "https://a/"]
    assert mirrors_with_override(mirrors, "ACCELBENCH_CIFAR10_MIRROR", "x", env) == mirrors


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("missing", "no such folder"),
        ("file", "a file, not a folder"),
        ("ftp://host/mnist/", "unsupported mirror scheme 'ftp'"),
    ],
)
def test_environment_mirror_that_cannot_be_used_is_refused(tmp_path, value, problem) -> None:
    """A user who set the variable means that copy: a typo in it is an error before any
    download, not a silent fall-back to the internet mirrors."""
    (tmp_path / "file").write_text("x")
    override = value if "://" in value else str(tmp_path / value)
    env = {mnist.MIRROR_ENV: override}
    with pytest.raises(InputError) as raised:
        mirrors_with_override(["https://a/"], mnist.MIRROR_ENV, "the four MNIST .gz files", env)
    message = str(raised.value)
    assert message.startswith(f"${mnist.MIRROR_ENV}={override}: {problem}")
    assert "the four MNIST .gz files" in message and "unset it" in message


def test_a_full_disk_stops_the_download_at_once(payload, tmp_path, monkeypatch) -> None:
    """A write that fails for want of space is this machine's, not the mirror's: it was
    logged as the mirror failing, the next mirrors were tried, and the error blamed them."""
    import errno

    from accelbench.data import download

    _, sha = payload
    tried = []

    def full(mirror, *_args) -> None:
        tried.append(mirror)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(download, "_fetch", full)
    with pytest.raises(OSError) as raised:
        _download(NAME, sha, tmp_path, ["https://a/", "https://b/"])
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / NAME)
    assert tried == ["https://a/"]
    assert list(tmp_path.iterdir()) == []  # no .part left


def test_unsupported_scheme_is_reported(payload, tmp_path) -> None:
    _, sha = payload
    with pytest.raises(DownloadError, match="unsupported mirror scheme 'ftp'"):
        _download(NAME, sha, tmp_path, ["ftp://example/mnist"])


def test_a_trickling_server_meets_the_deadline(server, payload, tmp_path) -> None:
    """Every byte resets the per-read timeout; the deadline bounds the whole file."""
    url, handler = server
    raw, sha = payload
    handler.files[f"slow/{STEM}.gz"] = gzip.compress(raw)
    handler.drip.add(f"slow/{STEM}.gz")
    started = time.monotonic()
    with pytest.raises(DownloadError, match="deadline"):
        _download(NAME, sha, tmp_path, [f"{url}/slow"], timeout_s=5, deadline_s=1)
    assert time.monotonic() - started < 4
    assert _only_final_file(tmp_path) == []


@pytest.mark.parametrize("twice", [False, True], ids=["the .gz", "the .gz gzipped again"])
def test_content_encoding_gzip_is_handled(server, payload, tmp_path, twice) -> None:
    url, handler = server
    raw, sha = payload
    body = gzip.compress(raw)
    handler.files[f"enc/{STEM}.gz"] = gzip.compress(body) if twice else body
    handler.gzip_encoding.add(f"enc/{STEM}.gz")
    path = _download(NAME, sha, tmp_path, [f"{url}/enc"], timeout_s=5, retries=0)
    assert gzip.decompress(path.read_bytes()) == raw


def test_the_log_names_the_mirrors_that_failed_before_one_served(
    server, payload, tmp_path, capsys
) -> None:
    url, handler = server
    raw, sha = payload
    handler.files[f"good/{STEM}.gz"] = gzip.compress(raw)
    _download(NAME, sha, tmp_path, [f"{url}/missing", f"{url}/good"], retries=0)
    err = capsys.readouterr().err
    assert f"mirror {url}/missing failed (HTTPError: 404" in err
    assert f"{STEM}.gz verified, from {url}/good, after 1 failed mirror(s)" in err


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_downloads_follow_the_umask_and_leftovers_go(fake_mnist, tmp_path, umask) -> None:
    mirror, checksums = fake_mnist
    out = tmp_path / "raw"
    out.mkdir()
    leftover = out / ".train-images-idx3-ubyte.gz.abc123.part"  # a download killed mid-file
    leftover.write_bytes(b"half")
    previous = os.umask(umask)
    try:
        remove_leftovers(out, [f"{stem}.gz" for stem in mnist.FILES])
        stem = "t10k-labels-idx1-ubyte"
        path = _download(f"{stem}.gz", checksums[stem], out, [str(mirror)])
    finally:
        os.umask(previous)
    assert not leftover.exists()
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_prepare_refuses_a_gzip_that_is_not_mnist_and_writes_a_manifest(fake_mnist, tmp_path):
    mirror, checksums = fake_mnist
    with pytest.raises(InputError, match=r"train-images-idx3-ubyte\.gz: not MNIST.s content"):
        _prepare(mirror, tmp_path / "p")  # the canonical checksums, fake files
    assert not (tmp_path / "p").exists()
    _prepare(mirror, tmp_path / "p", checksums)
    manifest = json.loads((tmp_path / "p" / MANIFEST).read_text())["sha256"]
    assert {"train_images.npy", "test_labels.npy", "MNIST/raw/t10k-images-idx3-ubyte"} <= set(
        manifest
    )


# --- IDX --------------------------------------------------------------------------------


def test_parse_good_images_and_labels() -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(3, 28, 28)).astype(np.uint8)
    decoded = mnist.parse_idx(idx_bytes(images, mnist.IMAGES_MAGIC), mnist.IMAGES_MAGIC)
    np.testing.assert_array_equal(decoded, images)
    labels = np.array([7, 2, 1], dtype=np.uint8)
    np.testing.assert_array_equal(
        mnist.parse_idx(idx_bytes(labels, mnist.LABELS_MAGIC), mnist.LABELS_MAGIC), labels
    )


def test_bad_magic() -> None:
    labels = idx_bytes(np.zeros(5, np.uint8), mnist.LABELS_MAGIC)
    with pytest.raises(mnist.IdxFormatError, match="magic number 2049, expected 2051"):
        mnist.parse_idx(labels, mnist.IMAGES_MAGIC, "x")


@pytest.mark.parametrize("cut", [3, 10, 1])
def test_truncated(cut: int) -> None:
    buffer = idx_bytes(np.zeros((2, 28, 28), np.uint8), mnist.IMAGES_MAGIC)
    with pytest.raises(mnist.IdxFormatError):
        mnist.parse_idx(buffer[: len(buffer) - cut] if cut != 3 else buffer[:3], mnist.IMAGES_MAGIC)


def test_size_mismatch_and_wrong_shape() -> None:
    buffer = idx_bytes(np.zeros((2, 28, 28), np.uint8), mnist.IMAGES_MAGIC) + b"\0"
    with pytest.raises(mnist.IdxFormatError, match="header's dimensions"):
        mnist.parse_idx(buffer, mnist.IMAGES_MAGIC)
    small = idx_bytes(np.zeros((2, 14, 14), np.uint8), mnist.IMAGES_MAGIC)
    with pytest.raises(mnist.IdxFormatError, match="expected 28x28"):
        mnist.parse_idx(small, mnist.IMAGES_MAGIC)


def test_prepare_writes_arrays_and_torchvision_layout(prepared) -> None:
    split = load_split(prepared, "train")
    assert split.images.shape == (512, 28, 28) and split.images.dtype == np.uint8
    assert split.labels.shape == (512,)
    assert load_split(prepared, "test", limit=100).labels.shape == (100,)
    assert (prepared / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file()


def test_prepare_rejects_mismatched_counts(fake_mnist, tmp_path) -> None:
    mirror, _ = fake_mnist
    (mirror / "t10k-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes(np.zeros(3, np.uint8), mnist.LABELS_MAGIC))
    )
    with pytest.raises(mnist.IdxFormatError, match="256 images but 3 labels"):
        _prepare(mirror, tmp_path / "p", checksums=None)
