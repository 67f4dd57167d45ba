"""AMQPS with pika's ssl context: a Warren started by this module with a TLS listener that asks
for client certificates (verify_peer), PLAIN over TLS, SASL EXTERNAL with a client certificate,
TLS 1.2, and an untrusted client certificate refused during the handshake.

Certificates are made here with `cryptography` for each run; no key is committed. The module is
skipped when WARREN_BIN does not name a Warren binary (e.g. when the suite runs against another
broker through AMQP_URL).
"""
import datetime
import ipaddress
import os
import socket
import subprocess
import tempfile
import time

import pika
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import uniq

WARREN_BIN = os.environ.get("WARREN_BIN", "")

pytestmark = pytest.mark.skipif(
    not os.access(WARREN_BIN, os.X_OK),
    reason="needs WARREN_BIN, a Warren binary to start with TLS",
)

ORG = "Warren interop"


def _name(cn):
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def _cert(subject, key, issuer, issuer_key, ca=False, server=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(path, cert, key):
    with open(path + ".pem", "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(path + ".key", "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return path + ".pem", path + ".key"


def _issue(directory, name, cn, ca_cert, ca_key, server=False):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(_name(cn), key, ca_cert.subject, ca_key, server=server)
    return _write(os.path.join(directory, name), cert, key)


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _wait_open(port, proc, log):
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("warren exited: " + open(log).read())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("warren did not listen on %d" % port)


@pytest.fixture(scope="module")
def tls_broker():
    with tempfile.TemporaryDirectory(prefix="warren-interop-tls-") as d:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _cert(_name("Interop CA"), ca_key, _name("Interop CA"), ca_key, ca=True)
        ca_file, _ = _write(os.path.join(d, "ca"), ca_cert, ca_key)
        server_cert, server_key = _issue(d, "server", "localhost", ca_cert, ca_key, server=True)
        client = _issue(d, "client", "pika-client", ca_cert, ca_key)
        # A client certificate no CA of ca_file signed.
        rogue_key = ec.generate_private_key(ec.SECP256R1())
        rogue_cert = _cert(_name("rogue"), rogue_key, _name("rogue"), rogue_key)
        rogue = _write(os.path.join(d, "rogue"), rogue_cert, rogue_key)

        amqp_port, tls_port = _free_port(), _free_port()
        config = os.path.join(d, "warren.toml")
        with open(config, "w") as f:
            f.write(
                """
[tls]
listen = "127.0.0.1:%(tls_port)d"
cert_file = "%(cert)s"
key_file = "%(key)s"
ca_file = "%(ca)s"
verify_peer = true

[auth]
mechanisms = ["PLAIN", "AMQPLAIN", "EXTERNAL"]

[[users]]
name = "guest"
password = "guest"

[[users]]
name = "CN=pika-client,O=%(org)s"
"""
                % {
                    "tls_port": tls_port,
                    "cert": server_cert,
                    "key": server_key,
                    "ca": ca_file,
                    "org": ORG,
                }
            )
        log = os.path.join(d, "warren.log")
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [
                    WARREN_BIN,
                    "--config",
                    config,
                    "--amqp-listen",
                    "127.0.0.1:%d" % amqp_port,
                    "--data-dir",
                    os.path.join(d, "data"),
                    "--log-level",
                    "warn",
                    "--httpmq-listen",
                    "127.0.0.1:0",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_open(tls_port, proc, log)
            yield {
                "port": tls_port,
                "ca": ca_file,
                "client": client,
                "rogue": rogue,
            }
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _params(broker, credentials, client=None, maximum_version=None):
    import ssl

    ctx = ssl.create_default_context(cafile=broker["ca"])
    if client:
        ctx.load_cert_chain(client[0], client[1])
    if maximum_version:
        ctx.maximum_version = maximum_version
    p = pika.ConnectionParameters(
        host="127.0.0.1",
        port=broker["port"],
        credentials=credentials,
        ssl_options=pika.SSLOptions(ctx, "localhost"),
    )
    p.socket_timeout = 5
    p.stack_timeout = 10
    p.connection_attempts = 1
    return p


def _round_trip(conn, prefix):
    ch = conn.channel()
    q = uniq(prefix)
    ch.queue_declare(q, auto_delete=True)
    ch.basic_publish("", q, b"over TLS")
    deadline = time.time() + 10
    while time.time() < deadline:
        method, _, body = ch.basic_get(q, auto_ack=True)
        if method:
            assert body == b"over TLS"
            ch.queue_delete(q)
            return
        time.sleep(0.02)
    pytest.fail("message not delivered over TLS")


def test_plain_login_over_tls(tls_broker):
    conn = pika.BlockingConnection(
        _params(tls_broker, pika.PlainCredentials("guest", "guest"))
    )
    try:
        _round_trip(conn, "tls.plain")
    finally:
        conn.close()


def test_tls12_client(tls_broker):
    import ssl

    conn = pika.BlockingConnection(
        _params(
            tls_broker,
            pika.PlainCredentials("guest", "guest"),
            maximum_version=ssl.TLSVersion.TLSv1_2,
        )
    )
    try:
        _round_trip(conn, "tls.12")
    finally:
        conn.close()


def test_external_login_with_a_client_certificate(tls_broker):
    conn = pika.BlockingConnection(
        _params(tls_broker, pika.credentials.ExternalCredentials(), client=tls_broker["client"])
    )
    try:
        _round_trip(conn, "tls.external")
    finally:
        conn.close()


def test_external_is_not_offered_without_a_client_certificate(tls_broker):
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(_params(tls_broker, pika.credentials.ExternalCredentials()))


def test_untrusted_client_certificate_is_refused(tls_broker):
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        conn = pika.BlockingConnection(
            _params(tls_broker, pika.PlainCredentials("guest", "guest"), client=tls_broker["rogue"])
        )
        # With TLS 1.3 the refusal may only show once the client reads.
        conn.channel()
