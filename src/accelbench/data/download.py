"""Verified, atomic downloads from a list of mirrors: what every dataset's download shares.

A mirror is an http(s):// URL, a file:// URL or a folder; an environment variable named by
the dataset puts one in front of the list. Each file comes from the first mirror whose copy
passes the dataset's `check` (else `ChecksumError`), through a `.part` file in the same
folder renamed into place with the umask's mode (a killed download's `.part` files go at the
next start), within an overall deadline besides the per-read timeout. A verified file at the
final path is kept (DVC keeps the stage's folder, so a re-run needs no network); a damaged
copy is fetched again; anything else there is refused.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from accelbench.core.console import DISK_FULL_ERRNOS, AccelbenchError, InputError, clip, log

_CHUNK = 1 << 20


class DownloadError(AccelbenchError, RuntimeError):
    """Every mirror failed for a file; the message names each mirror and why."""


class ChecksumError(ValueError):
    """A file is not the one expected (its checksum, or its format, differs)."""


class DamagedError(ChecksumError):
    """A damaged copy of the expected file (its gzip stream breaks): fetched again, not refused."""


def mirrors_with_override(
    mirrors: Iterable[str], variable: str, holding: str, env: Mapping[str, str] = os.environ
) -> list[str]:
    """The mirror list, with the one in $`variable` (if set) tried first. The variable is the
    user's own instruction to use a copy (`holding` says of what), so a local one that is not
    a folder is refused before any download, rather than passed over for the internet."""
    override = env.get(variable, "").strip()
    if not override:
        return list(mirrors)
    try:
        local = _local_dir(override)
        problem = None
        if local is not None and not local.is_dir():
            problem = "a file, not a folder" if local.exists() else "no such folder"
    except ValueError as exc:
        problem = str(exc)
    if problem:
        raise InputError(
            f"${variable}={clip(override)}: {problem}. Set it to a folder holding {holding} "
            "(or a file:// or http(s) URL), or unset it to use the mirrors in params.yaml"
        )
    return [override, *(m for m in mirrors if m != override)]


def _session(retries: int) -> requests.Session:
    session = requests.Session()
    retry = Retry(
        total=retries,
        backoff_factor=0.5,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=("GET",),
        raise_on_status=False,
    )
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=retry))
    return session


def _local_dir(mirror: str) -> Path | None:
    """A mirror given as a directory path or a file:// URL; None for http(s)."""
    parsed = urlparse(mirror)
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # plain path (or a Windows drive)
        return Path(mirror).expanduser()
    raise ValueError(
        f"unsupported mirror scheme {parsed.scheme!r} (use http(s)://, file:// or a path)"
    )


def _fetch(
    mirror: str,
    name: str,
    dest: Path,
    session: requests.Session,
    timeout_s: float,
    deadline_s: float,
) -> None:
    """Copy `name` from `mirror` into the temporary file `dest`, within `deadline_s` (a
    server that trickles bytes resets the per-read timeout, never the deadline)."""
    local = _local_dir(mirror)
    if local is not None:
        source = local / name
        if not source.is_file():
            raise FileNotFoundError(f"{source} does not exist")
        shutil.copyfile(source, dest)
        return
    url = mirror.rstrip("/") + "/" + name
    started = time.monotonic()
    with session.get(url, stream=True, timeout=timeout_s) as response:
        response.raise_for_status()
        expected = response.headers.get("Content-Length")
        written = 0
        with open(dest, "wb") as out:
            # The bytes as sent (Content-Length counts them): a .gz served with
            # `Content-Encoding: gzip` is the .gz itself; read1 returns what has arrived.
            while chunk := response.raw.read1(_CHUNK, decode_content=False):
                out.write(chunk)
                written += len(chunk)
                if time.monotonic() - started > deadline_s:
                    raise TimeoutError(
                        f"not complete after the {deadline_s:g} s deadline ({written} bytes; "
                        "data.deadline_s)"
                    )
        if expected is not None and written != int(expected):
            raise OSError(f"truncated: got {written} of {expected} bytes")
        if "gzip" in response.headers.get("Content-Encoding", "").lower():
            _unwrap_transfer_gzip(dest)


def _unwrap_transfer_gzip(path: Path) -> None:
    """A server that gzips the .gz again on the way: keep the .gz inside."""
    with gzip.open(path, "rb") as stream:
        try:
            nested = stream.read(2) == b"\x1f\x8b"  # gzip's magic number
        except (OSError, EOFError):
            return  # the dataset's check says what is wrong with it
    if nested:
        unwrapped = path.with_name(path.name + ".inner")
        unwrapped.unlink(missing_ok=True)  # a leftover (or a link): never written through
        with gzip.open(path, "rb") as stream, open(unwrapped, "wb") as out:
            shutil.copyfileobj(stream, out, _CHUNK)
        os.replace(unwrapped, path)


def _umask_mode() -> int:
    """The mode a new file gets under the process's umask (mkstemp's 0600 is not it)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def remove_leftovers(folder: Path, names: Iterable[str]) -> None:
    """The temporaries a killed earlier download of `names` left in `folder` (its own only:
    `.<name>.<random>.part`, and `.inner` beside it; other files in the folder stay)."""
    for name in names:  # (glob finds nothing in a folder that is not there)
        for leftover in (*folder.glob(f".{name}.*.part"), *folder.glob(f".{name}.*.part.inner")):
            if leftover.is_file() or leftover.is_symlink():
                leftover.unlink(missing_ok=True)


def output_folder(folder: Path) -> Path:
    """`--out` as a folder to write into (created if absent); a file there is refused."""
    if folder.exists() and not folder.is_dir():  # as outputs.refuse_foreign_folder says it
        what = "a file" if folder.is_file() else "a special file"
        raise InputError(
            f"{folder}: exists and is {what}, not a folder; accelbench writes its outputs into "
            "a folder: move it away or pass another path"
        )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def refuse_foreign_download(final: Path, check: Callable[[Path], None], what: str) -> bool:
    """Whether the verified file is at a download's final path already (kept); anything else
    there is the user's and is refused, before any download starts."""
    if not final.exists():  # absent, or a dangling link
        return False
    if final.is_file():
        try:
            check(final)
            return True
        except DamagedError as exc:
            log(f"download: {final} is a damaged copy ({exc}): fetching it again")
            return False
        except (ChecksumError, OSError):
            pass
    raise InputError(
        f"{final}: exists and is not {what} (it does not verify); download replaces only its "
        "own files: move it away (a damaged or partial copy of it: delete it, and the next "
        "run fetches it) or pass another --out"
    )


# urllib3 names the connection before its reason: "HTTPSConnection(host='h', port=443): ..."
# (a host in quotes, so an IPv6 address's colons stay in it).
_CONNECTION_PREFIX = re.compile(r"^<?\w*Connection(?:Pool)?\(host='[^']*', port=\d+\)[^:]*:\s*")


def _reason(exc: BaseException) -> str:
    """Why a mirror failed, in a phrase: the innermost error (requests wraps urllib3's
    MaxRetryError, which holds the last attempt's: a name that does not resolve, a refused
    connection, a timeout), without the wrappers' repeated host and URL."""
    inner: BaseException = exc
    for _ in range(4):  # requests -> MaxRetryError -> NewConnectionError (bounded: no cycles)
        nested = getattr(inner, "reason", None)
        if nested is None and isinstance(inner, requests.RequestException) and inner.args:
            nested = inner.args[0]
        if not isinstance(nested, BaseException):
            break
        inner = nested
    # urllib3's connection errors carry (connection, message): the message is the reason
    args = inner.args
    said = args[-1] if inner is not exc and len(args) > 1 and isinstance(args[-1], str) else inner
    text = _CONNECTION_PREFIX.sub("", " ".join(str(said).split()))
    shown = type(exc).__name__ if inner is exc else f"{type(exc).__name__}, {type(inner).__name__}"
    return f"{shown}: {text}"


def download_file(
    name: str,
    check: Callable[[Path], None],
    out_dir: Path,
    mirrors: list[str],
    *,
    variable: str,
    setting: str = "data.mirrors",
    timeout_s: float = 30.0,
    retries: int = 2,
    deadline_s: float = 600.0,
    verified: bool | None = None,
) -> Path:
    """Fetch `name` into `out_dir` from the first mirror whose copy `check` accepts, logging
    each that failed; when all fail, the error names each mirror and why, and $`variable`.
    `verified`: `refuse_foreign_download`'s answer for the file, where the caller has it."""
    final = out_dir / name
    output_folder(out_dir)
    if verified is None:
        verified = refuse_foreign_download(final, check, f"the verified {name}")
    if verified:
        log(f"download: {name} verified, here already: nothing fetched")
        return final
    failures: list[str] = []
    session = _session(retries)
    for mirror in mirrors:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=out_dir)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            _fetch(mirror, name, tmp, session, timeout_s, deadline_s)
            check(tmp)
            tmp.chmod(_umask_mode())
            os.replace(tmp, final)
            after = f", after {len(failures)} failed mirror(s)" if failures else ""
            log(f"download: {name} verified, from {mirror}{after}")
            return final
        except (OSError, ValueError, urllib3.exceptions.HTTPError) as exc:  # requests': OSErrors
            if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
                # this machine's disk, not the mirror: the next mirror would fail the same way
                raise OSError(exc.errno, exc.strerror, str(final)) from exc
            reason = _reason(exc)
            failures.append(f"{clip(mirror)}: {clip(reason, 160)}")
            log(f"download: {name}: mirror {mirror} failed ({clip(reason, 300)})")
        finally:
            tmp.unlink(missing_ok=True)
    # The remedy first: the line is cut at the CLI's limit, and the failures are logged above.
    raise DownloadError(
        f"could not get a verified copy of {name} from any of {len(mirrors)} mirror(s). "
        f"To use a local copy, set {variable} to a folder holding {name} (or a "
        f"file:// or http(s) URL), or list one in {setting} in params.yaml "
        f"(docs/air-gapped.md). Each mirror: {'; '.join(failures)}"
    )


def download_files(
    out_dir: Path,
    checks: Mapping[str, Callable[[Path], None]],
    mirrors: list[str],
    what: str,
    **options: Any,
) -> list[Path]:
    """A dataset's files (`checks`: each name's check) in `out_dir`, by `download_file` with
    `options`. A file there that does not verify (`what`, formatted with the name, says what
    it should be) is refused before the first download."""
    output_folder(out_dir)
    here = {  # every file checked before the first download: a foreign one stops it all
        name: refuse_foreign_download(out_dir / name, check, what.format(name))
        for name, check in checks.items()
    }
    remove_leftovers(out_dir, checks)
    return [
        download_file(name, check, out_dir, mirrors, verified=here[name], **options)
        for name, check in checks.items()
    ]
