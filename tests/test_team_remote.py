"""A team's DVC remote (docs/teams.md): after `dvc repro`, a commit and `dvc push`, a
colleague's `git clone` + `dvc pull` has the same report, metrics, models and data, byte for
byte, and re-runs nothing but the `env` probe. Pushed to a folder and, through DVC's ssh
plugin (the `team` extra), to an SSH remote on 127.0.0.1 served by Debian's `openssh-server`,
which the test starts on a free port with its own host key and one authorized key. Without
sshd the test skips, unless ACCELBENCH_REQUIRE_SERVICES=1 (CI) makes that a failure.

The remotes are configured with `dvc remote add --local`: nothing committed names a machine.
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_team_server import (
    dvc,
    free_port,
    git,
    pipeline_env,
    require,
    small_repo,
    stages_run,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.services]

SSHD = Path("/usr/sbin/sshd")
# Outputs DVC restores from a remote; env/ is each machine's own (not cached, not pushed).
PULLED = ("data", "models", "metrics", "reports")
COMMITTED = ("dvc.lock", "reports/metrics", "reports/plots", "params.yaml")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
            return connection.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@pytest.fixture
def ssh_remote(tmp_path) -> Iterator[tuple[str, Path]]:
    """sshd on 127.0.0.1 accepting one key, for the user running the tests; a HOME whose
    ~/.ssh holds that key and the server's host key (as a user's would after a first `ssh`).
    Yields (the remote's ssh:// URL, that HOME)."""
    require(SSHD.is_file(), f"openssh-server ({SSHD})")
    folder, home = tmp_path / "sshd", tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    folder.mkdir()
    keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
    subprocess.run([*keygen, "-f", str(folder / "host_key")], check=True)
    subprocess.run([*keygen, "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    (folder / "authorized_keys").write_text((home / ".ssh" / "id_ed25519.pub").read_text())
    port = free_port()
    host_key = (folder / "host_key.pub").read_text().split()[:2]
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_key)}\n")
    config = folder / "sshd_config"
    config.write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {folder / 'host_key'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile {folder / 'sshd.pid'}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
        "Subsystem sftp internal-sftp\n"
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege-separation folder
    log = (folder / "sshd.log").open("w")
    process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)], stderr=log, start_new_session=True
    )
    try:
        wait_for(lambda: process.poll() is None and _listening(port), 30, f"sshd on {port}")
        user = pwd.getpwuid(os.geteuid()).pw_name
        yield f"ssh://{user}@127.0.0.1:{port}{tmp_path / 'ssh-remote'}", home
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        log.close()


def _files(root: Path) -> dict[str, bytes]:
    """The pipeline's results under `root`, by path. compare's `reports/pipeline_time.json`
    (where the pipeline's time went, on the machine that ran it) is no DVC output: not pulled."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for top in PULLED
        for path in sorted((root / top).rglob("*"))
        if path.is_file() and path != root / "reports" / "pipeline_time.json"
    }


def test_a_colleagues_clone_pulls_the_same_results_and_reruns_nothing(ssh_remote, tmp_path) -> None:
    ssh_url, home = ssh_remote
    repo, mirror = small_repo(tmp_path)
    env = pipeline_env(mirror, None, HOME=str(home))

    shared_git = tmp_path / "team.git"  # the team's repository
    git(tmp_path, "init", "-q", "--bare", str(shared_git), env=env)
    git(repo, "remote", "add", "origin", str(shared_git), env=env)
    git(repo, "push", "-q", "-u", "origin", "HEAD", env=env)

    # docs/teams.md, the one who ran the pipeline
    dvc(repo, "repro", env=env)
    git(repo, "add", *COMMITTED, env=env)
    git(repo, "commit", "-qm", "run: tiny", env=env)
    folder_remote = tmp_path / "team-remote"
    dvc(repo, "remote", "add", "--local", "-d", "team", str(folder_remote), env=env)
    dvc(repo, "push", env=env)
    dvc(repo, "remote", "add", "--local", "-d", "team-ssh", ssh_url, env=env)
    pushed = dvc(repo, "push", env=env)
    assert "pushed" in pushed.stdout, pushed.stdout
    assert "team" not in (repo / ".dvc" / "config").read_text()  # nothing committed names a machine
    git(repo, "push", "-q", env=env)
    assert git(repo, "status", "--porcelain", env=env) == ""
    expected = _files(repo)
    assert {"models/cpu.pt", "reports/comparison.md", "metrics/cpu/train.json"} <= set(expected)

    for name, url in (("folder", str(folder_remote)), ("ssh", ssh_url)):
        # docs/teams.md, a colleague
        clone = tmp_path / f"colleague-{name}"
        git(tmp_path, "clone", "-q", str(shared_git), str(clone), env=env)
        dvc(clone, "remote", "add", "--local", "-d", "team", url, env=env)
        dvc(clone, "pull", env=env)
        assert (clone / "metrics" / "cpu" / "run.json").is_file(), (
            "metrics/cpu/run.json was not pulled: dvc.yaml keeps it out of the DVC cache "
            "(cache: false) and git ignores metrics/, so the colleague's evaluate@cpu re-runs"
        )
        assert _files(clone) == expected, name

        status = dvc(clone, "status", env=env).stdout
        # Only the machine probe: its facts are this machine's to write (not cached, not
        # pushed), and the stages that read them wait for them.
        assert "env/cpu.json" in status and "models/cpu.pt" not in status, status
        rerun = dvc(clone, "repro", env=env)
        assert stages_run(rerun) == ["env"], rerun.stdout
        status = dvc(clone, "status", env=env).stdout
        assert status.split() == ["env:", "always", "changed"], status
        assert _files(clone) == expected, name
        assert git(clone, "status", "--porcelain", env=env) == "", name


def test_dvcs_ssh_remote_does_not_check_the_host_key(ssh_remote, tmp_path) -> None:
    """What docs/teams.md warns: DVC's ssh plugin (sshfs) connects with asyncssh's
    `known_hosts=None`, so a host key that is not the one in ~/.ssh/known_hosts, or no
    known_hosts at all, does not stop a push; and DVC has no remote option that turns the
    check on. If this fails, DVC started checking: correct the doc."""
    ssh_url, home = ssh_remote
    env = pipeline_env(tmp_path, None, HOME=str(home))
    repo = tmp_path / "tiny"
    repo.mkdir()
    git(repo, "init", "-q", env=env)
    dvc(repo, "init", "-q", env=env)
    (repo / "data.txt").write_text("pushed past a wrong host key\n")
    dvc(repo, "add", "data.txt", env=env)
    dvc(repo, "remote", "add", "--local", "-d", "team", ssh_url, env=env)

    known_hosts = home / ".ssh" / "known_hosts"
    impostor = tmp_path / "impostor_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    host = known_hosts.read_text().split()[0]
    known_hosts.write_text(
        f"{host} {' '.join(impostor.with_suffix('.pub').read_text().split()[:2])}\n"
    )
    assert "1 file pushed" in dvc(repo, "push", env=env).stdout

    known_hosts.unlink()
    (repo / "data.txt").write_text("and with no known_hosts at all\n")
    dvc(repo, "add", "data.txt", env=env)
    assert "1 file pushed" in dvc(repo, "push", env=env).stdout

    option = dvc(repo, "remote", "modify", "--local", "team", "known_hosts", str(known_hosts),
                 env=env, check=False)  # fmt: skip
    assert option.returncode != 0 and "known_hosts" in option.stderr, option.stderr
