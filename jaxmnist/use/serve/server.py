"""Running the app: bind the socket ourselves, then hand it to uvicorn.

Binding before uvicorn does lets a port in use become one clear line (uvicorn
would log and exit on its own), and lets `--port 0` pick a free port that is
then printed. Only loopback Host headers are accepted while bound to loopback.
"""

from __future__ import annotations

import errno
import signal
import socket
import sys
import threading

from jaxmnist.errors import ConfigError, JaxmnistError
from jaxmnist.use.predict import TrainedModel, load_trained

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); JaxmnistError if that is not possible."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not an address of this machine ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart despite TIME_WAIT
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise JaxmnistError(
                f"port {port} on {host} is already in use; stop what uses it or choose "
                "another with --port"
            ) from None
        raise JaxmnistError(f"cannot listen on {host} port {port}: {e.strerror or e}") from None
    # Listening now queues the first connections until uvicorn accepts them, so the
    # address printed at start-up answers at once.
    sock.listen(2048)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def make_server(model: TrainedModel, sock: socket.socket, host: str):
    """A uvicorn.Server for `model` on the bound `sock` (the model compiles here)."""
    import uvicorn

    from jaxmnist.use.serve.app import create_app  # optional extra: serve (starlette)

    hosts = ("127.0.0.1", "localhost", "[::1]") if host in LOOPBACK else ("*",)
    config = uvicorn.Config(
        create_app(model, allowed_hosts=hosts),
        log_level="warning",
        access_log=False,
        limit_concurrency=256,  # beyond this, 503 rather than unbounded memory
        timeout_keep_alive=5,
    )
    return uvicorn.Server(config)


def serve(
    run_dir, host: str = "127.0.0.1", port: int = 8000, member=None, memory_budget_mb=None
) -> int:
    """Serves `run_dir`'s model (the ensemble of a run of several seeds, or `member`: see
    `predict.load_trained`, with `memory_budget_mb`) until interrupted; returns the exit
    code."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(
            "jaxmnist serve needs Starlette and uvicorn: pip install 'jaxmnist[serve]'"
        ) from None
    model = load_trained(run_dir, member, memory_budget_mb)
    sock = bind(host, port)
    server = make_server(model, sock, host)
    print(f"serving {model.describe()}", flush=True)
    print(f"open {url_of(sock)} (Ctrl+C to stop)", flush=True)
    if host not in LOOPBACK:
        print(f"listening on {host}: other machines can reach this server", file=sys.stderr)
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # uvicorn stops on Ctrl+C even where SIGINT came ignored (a background job of a
        # shell without job control), then raises it again with the handler it replaced:
        # Python's, so that every Ctrl+C ends alike ("interrupted", exit 130).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    server.run(sockets=[sock])
    return 0
