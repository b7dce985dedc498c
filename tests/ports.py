"""A free TCP port on localhost for the multi-process tests (gloo rendezvous, torchrun, accelerate)."""
import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
