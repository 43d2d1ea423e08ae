"""Node-to-node login with the cluster key is its own bootstrap step: a server whose sshd takes keys
from elsewhere than ~/.ssh/authorized_keys (managed keys) is named, with the likely cause, before
mpirun fails with its generic message."""

import signal

import pytest
import test_hosts
from conftest import ftc

pytestmark = pytest.mark.slow

servers, user_key = test_hosts.servers, test_hosts.user_key  # own servers, as test_hosts starts them


def manage_keys(server) -> None:
    """The server's sshd now reads keys only from a file its admin manages (the user's key is there):
    a line ftc adds to ~/.ssh/authorized_keys is never read. sshd rereads its config on SIGHUP."""
    managed = server.root / "managed_keys"
    managed.write_text((server.home / ".ssh" / "authorized_keys").read_text())
    config = server.root / "sshd_config"
    config.write_text(config.read_text().replace(f"AuthorizedKeysFile {server.home}/.ssh/authorized_keys",
                                                 f"AuthorizedKeysFile {managed}"))
    server.proc.send_signal(signal.SIGHUP)
    server._wait_for_key(server.public_key)


def test_a_server_with_managed_keys_is_named_by_the_login_step_not_mpirun(ftc_home, servers, user_key):
    manage_keys(servers[1])
    up = ftc("up", "--name", "managed", *test_hosts.ssh_flags(servers, user_key), "--yes", "1")
    try:
        assert up.returncode == 1 and "Traceback" not in up.stderr, up.stderr[-3000:]
        node = f"managed-1 ({servers[1].spec.split(':')[0]})"
        assert (f"step 'verify logins' failed: {node} refused the cluster key (" in up.stderr
                and f"its sshd likely reads keys from elsewhere than {servers[1].home}/.ssh/authorized_keys (managed "
                "keys: AuthorizedKeysFile or AuthorizedKeysCommand in its sshd_config); add the key ending "
                "'ftc-managed-internal' there, then `ftc bootstrap --name managed`" in up.stderr), up.stderr[-3000:]
        assert "verify mpirun" not in up.stderr
    finally:
        assert ftc("down", "--name", "managed").returncode == 0
