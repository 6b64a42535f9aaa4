"""`ladle serve --ssl-keyfile K --ssl-certfile C` serves HTTPS (vLLM's flags, uvicorn's TLS): the
openai client completes over it, verifying the certificate; a lone key or certificate, or a
path that is no file, is refused at start-up naming the flag. vLLM's --disable-uvicorn-access-log
is accepted (ladle's default already) and --disable-fastapi-docs takes /docs away."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
import time

import httpx
import openai
import pytest

from ladle.cli.main import build_parser
from ladle.entrypoints.openai.http_server_options import HttpServerOptions
from tests.entrypoints.server_process import ServerProcess

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def _self_signed(folder) -> tuple[str, str]:
    """A key and a certificate for 127.0.0.1 that signs itself (so it is its own CA file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = folder / "key.pem", folder / "cert.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


def test_serve_speaks_https_with_the_given_certificate(tiny_model_path, tmp_path) -> None:
    key, cert = _self_signed(tmp_path)
    trusting = ssl.create_default_context(cafile=cert)
    args = [
        tiny_model_path("llama"), "--served-model-name", "tiny", "--cpu-kv-cache-gib", "0.05",
        "--ssl-keyfile", key, "--ssl-certfile", cert,
        "--disable-uvicorn-access-log", "--disable-fastapi-docs", "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    with ServerProcess(args, verify=trusting) as server:
        assert server.base_url.startswith("https://")
        # Closed before the server stops: an open keep-alive connection holds its graceful
        # shutdown to uvicorn's timeout.
        with httpx.Client(verify=trusting) as http:
            client = openai.OpenAI(
                base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, http_client=http
            )
            completion = client.completions.create(model="tiny", prompt="hi", max_tokens=3)
        assert completion.usage.completion_tokens == 3
        with pytest.raises(httpx.ConnectError):  # a client that does not trust it is refused
            httpx.get(f"{server.base_url}/health")
        for path in ("/docs", "/openapi.json"):
            assert httpx.get(f"{server.base_url}{path}", verify=trusting).status_code == 404
        # A client that keeps its TLS connection open and idle does not hold the drain: it
        # held it for the whole --shutdown-timeout (30 s) before the server aborted such
        # connections.
        with httpx.Client(verify=trusting) as idle:
            assert idle.get(f"{server.base_url}/health").status_code == 200
            started = time.monotonic()
            server.stop(timeout_s=60)
            assert time.monotonic() - started < 10


def test_lone_or_missing_tls_files_are_refused_naming_the_flag(tmp_path) -> None:
    key, cert = _self_signed(tmp_path)

    def options(*flags: str) -> HttpServerOptions:
        return HttpServerOptions.from_args(build_parser().parse_args(["serve", "m", *flags]))

    assert options("--ssl-keyfile", key, "--ssl-certfile", cert).scheme == "https"
    assert options().scheme == "http"
    with pytest.raises(ValueError, match="--ssl-keyfile and --ssl-certfile go together"):
        options("--ssl-keyfile", key)
    with pytest.raises(ValueError, match="--ssl-certfile '/no/such.pem' is not a file"):
        options("--ssl-keyfile", key, "--ssl-certfile", "/no/such.pem")
    # --disable-uvicorn-access-log wins over --access-log, as the switch's name says.
    assert not options("--access-log", "--disable-uvicorn-access-log").access_log
    assert options("--access-log").access_log


def test_tls_with_ray_replicas_is_refused(tiny_model_path, tmp_path) -> None:
    """Ray Serve's proxy answers --replicas N, not ladle's uvicorn: TLS there is refused."""
    key, cert = _self_signed(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "ladle.cli", "serve", tiny_model_path("llama"), "--replicas", "2",
         "--ssl-keyfile", key, "--ssl-certfile", cert, "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "--ssl-keyfile / --ssl-certfile are not supported with --replicas" in done.stderr
