"""Clients on another node: TCP needs TLS and a bearer token.

Certificates are made per test run with openssl (a CA, the daemon's
certificate for localhost and 127.0.0.1, a client certificate, and a second
CA nobody signed with). Each failure gets its own error: a certificate not
trusted, a missing or wrong token, plaintext against a TLS port, a missing
client certificate; and plaintext TCP off loopback is refused at start.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from flagos_test_env import free_tcp_port

# A small model step on the device, checked against the CPU.
WORKLOAD = """
import json, torch, torch_fl
torch.manual_seed(0)
a, b = torch.randn(64, 64), torch.randn(64, 64)
got = (a.to("flagos") @ b.to("flagos")).relu().cpu()
print(json.dumps({"equal": bool(torch.allclose(got, (a @ b).relu(), atol=1e-5)),
                  "sessions": len(torch_fl.daemon_stats()["sessions"])}))
"""


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
            "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)


def make_signed(directory: Path, name: str, ca: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions + "\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
            cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "ca")
    make_ca(directory, "other-ca")
    make_signed(directory, "server", "ca",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    make_signed(directory, "client", "ca", "extendedKeyUsage=clientAuth")
    (directory / "token").write_text(secrets.token_hex(32) + "\n")
    return directory


def tls_daemon(start_daemon, pki: Path, *extra: str):
    port = free_tcp_port()
    daemon = start_daemon(extra_args=[
        f"--listen=localhost:{port}", f"--tls-cert={pki / 'server.pem'}",
        f"--tls-key={pki / 'server.key'}", f"--token-file={pki / 'token'}", *extra])
    return daemon, f"localhost:{port}"


def run_remote(run_python, endpoint: str, **env: str):
    # FLAGOS_ENDPOINT is the TCP endpoint; the client's other variables as given.
    base = {"FLAGOS_ENDPOINT": endpoint, "FLAGOS_TLS_CA": None, "FLAGOS_TOKEN": None,
            "FLAGOS_TOKEN_FILE": None, "FLAGOS_TLS_CERT": None, "FLAGOS_TLS_KEY": None}
    return run_python(WORKLOAD, env={**base, **env}, timeout=120)


def test_the_right_ca_and_token_work_and_the_token_is_never_logged(start_daemon, pki,
                                                                    run_python) -> None:
    daemon, endpoint = tls_daemon(start_daemon, pki)
    token = (pki / "token").read_text().strip()
    out = run_remote(run_python, endpoint, FLAGOS_TLS_CA=str(pki / "ca.pem"),
                     FLAGOS_TOKEN_FILE=str(pki / "token"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"equal": True, "sessions": 1}
    out = run_remote(run_python, endpoint, FLAGOS_TLS_CA=str(pki / "ca.pem"), FLAGOS_TOKEN=token)
    assert out.returncode == 0, out.stderr
    assert token not in daemon.log()


@pytest.mark.parametrize("case", ["wrong_ca", "no_token", "wrong_token", "plaintext"])
def test_each_mistake_gets_its_own_error(case: str, start_daemon, pki, run_python) -> None:
    daemon, endpoint = tls_daemon(start_daemon, pki)
    env = {"FLAGOS_TLS_CA": str(pki / "ca.pem"), "FLAGOS_TOKEN_FILE": str(pki / "token")}
    expected = {
        "wrong_ca": "the daemon's TLS certificate is not trusted: it does not chain to the CA in "
                    f"FLAGOS_TLS_CA={pki / 'other-ca.pem'}",
        "no_token": "flagosd requires a bearer token on TCP and the call carried none: set "
                    "FLAGOS_TOKEN or FLAGOS_TOKEN_FILE",
        "wrong_token": "flagosd refused the bearer token: FLAGOS_TOKEN / FLAGOS_TOKEN_FILE does "
                       "not hold the token of the node's flagosd",
        "plaintext": "if the daemon serves TLS, set FLAGOS_TLS_CA to its CA certificate",
    }[case]
    if case == "wrong_ca":
        env["FLAGOS_TLS_CA"] = str(pki / "other-ca.pem")
    elif case == "no_token":
        del env["FLAGOS_TOKEN_FILE"]
    elif case == "wrong_token":
        env = {"FLAGOS_TLS_CA": str(pki / "ca.pem"), "FLAGOS_TOKEN": secrets.token_hex(32)}
    else:
        env = {}
    out = run_remote(run_python, endpoint, **env)
    assert out.returncode != 0, out.stdout
    assert expected in out.stderr, out.stderr
    assert f"flagosd at {endpoint}" in out.stderr, out.stderr
    # The daemon serves the right client afterwards.
    ok = run_remote(run_python, endpoint, FLAGOS_TLS_CA=str(pki / "ca.pem"),
                    FLAGOS_TOKEN_FILE=str(pki / "token"))
    assert ok.returncode == 0, ok.stderr


def test_mutual_tls_needs_the_client_certificate(start_daemon, pki, run_python) -> None:
    daemon, endpoint = tls_daemon(start_daemon, pki, f"--tls-client-ca={pki / 'ca.pem'}")
    env = {"FLAGOS_TLS_CA": str(pki / "ca.pem"), "FLAGOS_TOKEN_FILE": str(pki / "token")}
    out = run_remote(run_python, endpoint, **env)
    assert out.returncode != 0
    assert "set FLAGOS_TLS_CERT and FLAGOS_TLS_KEY" in out.stderr, out.stderr
    out = run_remote(run_python, endpoint, **env, FLAGOS_TLS_CERT=str(pki / "client.pem"),
                     FLAGOS_TLS_KEY=str(pki / "client.key"))
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("args,expected", [
    (["--listen=0.0.0.0:{port}"],
     "--listen=0.0.0.0:{port}: TCP on a non-loopback address needs TLS and a token"),
    (["--listen=127.0.0.1:{port}"],
     "--listen=127.0.0.1:{port}: plaintext TCP is refused unless asked for with --insecure-tcp"),
    (["--listen=127.0.0.1:{port}", "--tls-cert=x.pem", "--tls-key=x.key"],
     "a TCP endpoint needs a bearer token as well as TLS: give --token-file"),
])
def test_tcp_without_tls_or_token_is_refused_at_start(args, expected, flagosd_binary,
                                                      tmp_path) -> None:
    port = free_tcp_port()
    out = subprocess.run([str(flagosd_binary), "--backend=cpu", "--metrics-listen=",
                          *[a.format(port=port) for a in args]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert expected.format(port=port) in out.stderr, out.stderr


def test_tls_to_a_plaintext_daemon_says_to_unset_the_ca_which_then_works(
    start_daemon, pki, run_python
) -> None:
    port = free_tcp_port()
    start_daemon(extra_args=[f"--listen=127.0.0.1:{port}", "--insecure-tcp"])
    endpoint = f"127.0.0.1:{port}"
    out = run_remote(run_python, endpoint, FLAGOS_TLS_CA=str(pki / "ca.pem"),
                     FLAGOS_TOKEN_FILE=str(pki / "token"))
    assert out.returncode != 0, out.stdout
    assert "unset FLAGOS_TLS_CA for a daemon started with --insecure-tcp" in out.stderr, out.stderr
    # The advice, followed (a token is never sent in plaintext: it goes too).
    ok = run_remote(run_python, endpoint)
    assert ok.returncode == 0, ok.stderr
