"""`jaxmnist serve`: the JSON API and its guards, through Starlette's test client, and
the real command on a real socket.

The model compiles once, when the app is built; a JAX monitoring listener counts
backend compilations while many kinds of request arrive, sixteen at a time.
"""

import contextlib
import io
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest

TestClient = pytest.importorskip("starlette.testclient", reason="needs the serve extra").TestClient
from PIL import Image, ImageDraw, ImageFile

from jaxmnist.cli import main
from jaxmnist.use import predict, preprocess
from jaxmnist.use.serve import app as app_lib

BASE = "http://127.0.0.1"


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def drawing(size=200, seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (size, size), "white")
    points = [tuple(rng.integers(size // 8, size - size // 8, 2).tolist()) for _ in range(4)]
    ImageDraw.Draw(image).line(points, fill="black", width=max(2, size // 12))
    return png(image)


@pytest.fixture(scope="module")
def model(tiny_model_run):
    return predict.load_trained(tiny_model_run)


@contextlib.contextmanager
def counting_compiles():
    """The programs compiled meanwhile, or loaded from the persistent compilation cache
    (which a program another test compiled alike may come from)."""
    compiles = []

    def compiled(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    def loaded(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(compiled)
    jax.monitoring.register_event_listener(loaded)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(compiled)
        jax.monitoring.unregister_event_listener(loaded)


@pytest.fixture(scope="module")
def client(model):
    with TestClient(app_lib.create_app(model), base_url=BASE) as c:
        yield c


def test_model_and_health(client, model):
    assert client.get("/healthz").json() == {"status": "ok"}
    info = client.get("/api/model").json()
    assert info["class_names"] == list(model.class_names) and info["input_shape"] == [28, 28]
    assert info["model"] == "mlp" and info["handwritten"] is True
    assert (
        info["description"]
        == "mlp in → " + " → ".join(map(str, model.config.model.hidden)) + " → out"
    )
    assert info["max_body_bytes"] == app_lib.MAX_BODY_BYTES


def test_png_and_json_answers_are_the_models(client, model, tiny_arrays):
    """A PNG goes through predict's preprocessing; a JSON array is fed as it is."""
    body = drawing()
    reply = client.post("/api/predict", content=body, headers={"content-type": "image/png"})
    assert reply.status_code == 200
    seen = preprocess.image_to_model_input(body)
    probs = predict.compile_predict(model, 1)(seen[None])[0]
    result = reply.json()
    assert result["input"] == seen.tolist()
    np.testing.assert_allclose(result["probabilities"], probs, atol=1e-6)
    assert result["top"][0]["class"] == int(probs.argmax())
    image = tiny_arrays["test_images"][3]
    for payload in ({"image": image.tolist()}, {"image": (image / 255).tolist()}):
        result = client.post("/api/predict", json=payload).json()
        assert result["input"] == image.tolist()
        expected = predict.compile_predict(model, 1)(image[None])[0]
        np.testing.assert_allclose(result["probabilities"], expected, atol=1e-6)
    as_is = client.post("/api/predict?preprocess=false", content=png(Image.fromarray(image)))
    assert as_is.json()["input"] == image.tolist()
    assert "warning" not in as_is.json() and "warning" not in result


def test_an_image_with_no_ink_is_answered_with_a_warning(client, model):
    blank = np.zeros(model.image_shape, np.uint8).tolist()
    result = client.post("/api/predict", json={"image": blank}).json()
    assert result["warning"] == preprocess.NO_INK and len(result["probabilities"]) == 10


def test_over_the_size_limit_is_413(client):
    big = b"\0" * (app_lib.MAX_BODY_BYTES + 1)
    assert client.post("/api/predict", content=big).status_code == 413

    def chunks():  # no Content-Length: the limit must hold while streaming
        for _ in range(3):
            yield b"\0" * (app_lib.MAX_BODY_BYTES // 2)

    reply = client.post("/api/predict", content=chunks())
    assert reply.status_code == 413 and "limit" in reply.json()["error"]


@pytest.mark.parametrize(
    "body, content_type, query",
    [
        (b"", "image/png", ""),
        (b"not an image at all", "image/png", ""),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 50, "image/png", ""),
        (b"{not json", "application/json", ""),
        (b"[1, 2, 3]", "application/json", ""),
        (b'{"image": [[1, 2], [3]]}', "application/json", ""),
        (b'{"image": [[1, 2], [3, 4]]}', "application/json", ""),
        (json.dumps({"image": [[300] * 28] * 28}).encode(), "application/json", ""),
        (
            json.dumps({"image": [[0.5] * 28] * 27 + [[float("nan")] * 28]}).encode(),
            "application/json",
            "",
        ),
        (b'{"image": [[{"a": 1}]]}', "application/json", ""),
        (b"\xff\xfe", "application/json", ""),
        (b"x", "image/png", "?preprocess=maybe"),
    ],
)
def test_malformed_bodies_are_400_with_a_json_error(client, body, content_type, query):
    reply = client.post(
        f"/api/predict{query}", content=body, headers={"content-type": content_type}
    )
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert set(reply.json()) == {"error"} and "Traceback" not in reply.text


def test_a_bug_is_a_500_without_a_traceback(model, monkeypatch):
    def broken(*args):
        raise RuntimeError("secret internal detail")

    app = app_lib.create_app(model)
    monkeypatch.setattr(app_lib.preprocess, "image_to_model_input", broken)
    with TestClient(app, base_url=BASE, raise_server_exceptions=False) as c:
        reply = c.post("/api/predict", content=drawing())
    assert reply.status_code == 500
    assert reply.json() == {"error": "internal error"}


def test_only_loopback_host_names_and_the_page_loads_only_itself(client):
    assert client.get("/", headers={"host": "attacker.example"}).status_code == 400
    page = client.get("/")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    links = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert links and all(link.startswith("/static/") for link in links), links
    for link in links:
        assert client.get(link).status_code == 200
    assert client.get("/static/../app.py").status_code == 404


def test_compiles_at_start_up_and_never_per_request(model, tiny_arrays):
    with counting_compiles() as compiles:
        app = app_lib.create_app(model)
        at_start = len(compiles)
        with TestClient(app, base_url=BASE) as c:
            bodies = [
                (drawing(size, seed), {"content-type": "image/png"})
                for size, seed in ((60, 1), (200, 2), (333, 3), (28, 4))
            ]
            arrays = [
                (json.dumps({"image": a.tolist()}).encode(), {"content-type": "application/json"})
                for a in tiny_arrays["test_images"][:4]
            ]

            def ask(i):
                body, headers = (bodies + arrays)[i % 8]
                return c.post("/api/predict", content=body, headers=headers).status_code

            with ThreadPoolExecutor(16) as pool:
                codes = list(pool.map(ask, range(64)))
    assert at_start >= 1, "the model should compile (or load) when the app is built"
    assert codes == [200] * 64
    assert len(compiles) == at_start, "a request compiled something"


def test_port_in_use_is_one_line_and_exit_1(tiny_model_run, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(tiny_model_run), "--port", str(port)]) == 1
    err = capsys.readouterr().err.splitlines()
    expected = (
        f"jaxmnist serve: error: port {port} on 127.0.0.1 is already in use; "
        "stop what uses it or choose another with --port"
    )
    assert err == [expected]


def test_argument_mistakes_exit_2(tiny_model_run, tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nowhere")]) == 2
    with pytest.raises(SystemExit) as e:
        main(["serve", str(tiny_model_run), "--port", "70000"])
    assert e.value.code == 2


# Starts the command given as its arguments with SIGINT ignored, as a shell without job
# control starts a background job (and everything the job starts): exec keeps it ignored.
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


@pytest.mark.parametrize("sigint", ["default", "inherited ignored"])
def test_the_command_serves_on_loopback_by_default(tiny_model_run, sigint):
    """The real command: it prints its address, answers there, and only on 127.0.0.1; Ctrl+C
    ends it alike whether SIGINT came to it at its default or ignored."""
    launch = [] if sigint == "default" else [sys.executable, "-c", IGNORING_SIGINT]
    proc = subprocess.Popen(
        [*launch, sys.executable, "-m", "jaxmnist", "serve", str(tiny_model_run), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 120
        while not any(line.startswith("open ") for line in lines) and time.monotonic() < deadline:
            lines.append(proc.stdout.readline())
        url = re.search(r"http://\S+/", lines[-1]).group(0)
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "healthz", timeout=30) as reply:
            assert json.load(reply) == {"status": "ok"}
        port = int(url.rsplit(":", 1)[1].strip("/"))
        try:
            addresses = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), port)}
        except socket.gaierror:
            addresses = set()
        for address in addresses - {"127.0.0.1", "127.0.1.1", "::1"}:
            if ":" not in address:  # this machine's other IPv4 addresses: nobody listens there
                with socket.socket() as s:
                    s.settimeout(5)
                    assert s.connect_ex((address, port)) != 0, address
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl+C
        _, err = proc.communicate(timeout=30)  # also closes the pipes
    assert proc.returncode == 130 and err.strip() == "jaxmnist serve: interrupted", err


def test_concurrent_requests_agree_with_one_at_a_time(client, tiny_arrays):
    images = tiny_arrays["test_images"][:16]
    alone = [client.post("/api/predict", json={"image": a.tolist()}).json() for a in images]
    results = [None] * 16

    def ask(i):
        results[i] = client.post("/api/predict", json={"image": images[i].tolist()}).json()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["probabilities"] for r in results] == [r["probabilities"] for r in alone]


def test_a_fashion_model_reads_photos_like_fashion_mnist(tiny_model_run, tmp_path):
    from test_predict import extent, fashion_copy

    model = predict.load_trained(fashion_copy(tiny_model_run, tmp_path))
    photo = Image.new("RGB", (300, 200), "white")
    ImageDraw.Draw(photo).rectangle([30, 40, 89, 159], fill="black")
    with TestClient(app_lib.create_app(model), base_url=BASE) as c:
        info = c.get("/api/model").json()
        seen = c.post("/api/predict", content=png(photo)).json()["input"]
    assert info["handwritten"] is False and info["class_names"][0] == "T-shirt/top"
    assert extent(np.asarray(seen)) == (28, 14)


def png_of_size(width: int, height: int) -> bytes:
    """A real, decodable PNG of `width` x `height` black pixels: a few kilobytes on the
    wire however many pixels it declares (zlib squeezes a blank image a thousandfold)."""
    return png(Image.new("1", (width, height)))


def test_too_many_pixels_is_413_before_decoding(model, monkeypatch):
    """The header's size is checked before a pixel is decoded: the decoder never runs."""
    width = app_lib.MAX_PIXELS // 1000 + 1  # 1000 rows: just over the cap
    body = png_of_size(width, 1000)
    assert len(body) < app_lib.MAX_BODY_BYTES
    decoded = []
    real_load = ImageFile.ImageFile.load

    def load(self):
        decoded.append(self.size)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    with TestClient(app_lib.create_app(model), base_url=BASE) as c:
        assert c.get("/api/model").json()["max_pixels"] == app_lib.MAX_PIXELS
        for query in ("", "?preprocess=false"):
            reply = c.post(f"/api/predict{query}", content=body)
            assert reply.status_code == 413, reply.text[:300]
            assert set(reply.json()) == {"error"} and "megapixels" in reply.json()["error"]
        assert decoded == []
        small = c.post("/api/predict", content=png_of_size(width // 4, 1000))
        assert small.status_code == 200 and set(decoded) == {(width // 4, 1000)}


def test_decodes_run_a_few_at_a_time(model, monkeypatch):
    """However many requests arrive at once, at most `DECODE_SLOTS` decode together."""
    running, most = [0], [0]
    lock = threading.Lock()
    real = app_lib.preprocess.image_to_model_input

    def counted(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(app_lib.preprocess, "image_to_model_input", counted)
    with TestClient(app_lib.create_app(model), base_url=BASE) as c:
        body = drawing()
        with ThreadPoolExecutor(12) as pool:
            codes = list(
                pool.map(lambda _: c.post("/api/predict", content=body).status_code, range(24))
            )
    assert codes == [200] * 24
    assert most[0] == app_lib.DECODE_SLOTS


def test_json_too_deep_to_parse_is_400_without_a_traceback(model, caplog):
    with TestClient(app_lib.create_app(model), base_url=BASE, raise_server_exceptions=False) as c:
        for depth in (100_000, 5_000, 900):
            for body in ("[" * depth + "]" * depth, '{"image": ' + "[" * depth + "]" * depth + "}"):
                reply = c.post(
                    "/api/predict", content=body, headers={"content-type": "application/json"}
                )
                assert reply.status_code == 400, (depth, reply.text)
                assert set(reply.json()) == {"error"} and "\n" not in reply.json()["error"]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in caplog.records)


@contextlib.contextmanager
def live_server(run_dir):
    """`jaxmnist serve`'s own uvicorn server on a free loopback port, in a thread."""
    from jaxmnist.use.serve import server as server_lib

    sock = server_lib.bind("127.0.0.1", 0)
    server = server_lib.make_server(predict.load_trained(run_dir), sock, "127.0.0.1")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        yield server_lib.url_of(sock)
    finally:
        server.should_exit = True
        thread.join(30)


def test_every_client_reads_the_413(tiny_model_run):
    """A client that sends its whole body before reading (as urllib does) reads the 413
    rather than a reset connection: the server drains what it refuses."""
    body = b"\0" * (3 * 1024 * 1024)
    with live_server(tiny_model_run) as url:
        for _ in range(20):
            request = urllib.request.Request(
                url + "api/predict", data=body, headers={"content-type": "image/png"}
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30).close()
            with refused.value:
                assert refused.value.code == 413
                assert "limit" in json.load(refused.value)["error"]
        # What is not read on: a client waiting for "100 Continue", and a body declared
        # beyond DRAIN_BYTES. Both hear 413 at once, with no byte of body sent.
        host, port = url.split("//")[1].strip("/").rsplit(":", 1)
        for declared, expect in ((3 * 1024 * 1024, True), (app_lib.DRAIN_BYTES + 1, False)):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(
                    f"POST /api/predict HTTP/1.1\r\nHost: {host}\r\n"
                    f"Content-Type: image/png\r\nContent-Length: {declared}\r\n".encode()
                    + (b"Expect: 100-continue\r\n" if expect else b"")
                    + b"\r\n"
                )
                assert s.recv(4096).startswith(b"HTTP/1.1 413 "), (declared, expect)
