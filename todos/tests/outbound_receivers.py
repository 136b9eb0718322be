"""Real receivers on loopback for the outbound tests: an HTTP server that records each request (and can
answer with a status or a redirect), and an SMTP server (aiosmtpd) that keeps each message."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    server: ThreadingHTTPServer
    requests: list[Received] = field(default_factory=list)
    status: int = 204
    location: str | None = None  # answer every request with a 302 to here
    scheme: str = "http"
    echo_challenge: bool = False  # answer an MCP Events verification envelope with its challenge

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{self.scheme}://{host}:{port}"

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            receiver.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            answer = b""
            if receiver.echo_challenge and b'"verification"' in body:
                answer = json.dumps({"challenge": json.loads(body)["challenge"]}).encode()
            if receiver.location is not None:
                self.send_response(302)
                self.send_header("location", receiver.location)
            else:
                self.send_response(receiver.status)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextlib.contextmanager
def running_receiver(tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    recv = Receiver(server, scheme="https" if tls is not None else "http")
    server.RequestHandlerClass = _handler(recv)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recv
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as recv:
        yield recv


@dataclass
class Mailbox:
    host: str
    port: int
    messages: list[Message] = field(default_factory=list)


@pytest.fixture
def smtp() -> Iterator[Mailbox]:
    from aiosmtpd.controller import Controller

    with socket.socket() as probe:  # a free port (aiosmtpd's readiness check connects to the port it is given)
        probe.bind(("127.0.0.1", 0))
        box = Mailbox("127.0.0.1", probe.getsockname()[1])

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            box.messages.append(message_from_bytes(envelope.original_content))
            return "250 OK"

    controller = Controller(Handler(), hostname=box.host, port=box.port)
    controller.start()
    yield box
    controller.stop()


def make_ca_and_cert(tmp_path: Any, name: str) -> tuple[str, ssl.SSLContext]:
    """A throwaway CA (its PEM file's path) and a server TLS context whose certificate it signed for ``name``."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "switchboard test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = tmp_path / "server.pem"
    chain.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain)
    return str(ca_file), context
