"""The web application: the page, `POST /api/predict`, `GET /api/model` and `GET /healthz`.

The model is compiled once, for a batch of one, when the app is built; every
request goes through that one compiled function under a lock, so concurrent
requests are served one model call at a time and nothing compiles again.
Decoding, preprocessing and the model call run in Starlette's thread pool, off
the event loop.
Bodies over `MAX_BODY_BYTES` get 413 (read on and dropped, up to `DRAIN_BYTES`, so
that every client can read the answer), and so do images whose header declares
more than `MAX_PIXELS`, before a pixel is decoded; at most `DECODE_SLOTS` requests
decode at once. Malformed bodies, JSON too deep to parse among them, get 400; every
error is JSON `{"error": "..."}` and never carries a traceback.
Every response carries a Content-Security-Policy that lets the page load
nothing but its own files and talk to nothing but this server.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jaxmnist.data.registry import DatasetSpec, get_spec
from jaxmnist.errors import DataError
from jaxmnist.use import preprocess
from jaxmnist.use.predict import TrainedModel, compile_predict, top_k

MAX_BODY_BYTES = 2 * 1024 * 1024
# A body over the limit is read on and dropped, up to this much, before the 413 goes out
# (see `read_body`): a few times the limit, so that a client that overshoots reads its
# answer, while nobody can make the server read without end.
DRAIN_BYTES = 4 * MAX_BODY_BYTES
# Decoded pixels allowed per image, far below Pillow's own bomb limit (which admits about
# 90 megapixels, hundreds of MB once decoded and converted). A digit drawn on the page is
# a few hundred pixels a side, a phone's photo of a garment 12 megapixels (4032 x 3024),
# and preprocessing shrinks everything to a 512 px working size first, so pixels beyond
# this buy only memory: 16 megapixels of RGBA are 64 MB decoded.
MAX_PIXELS = 16_000_000
# Requests decoding and preprocessing at once. Each may hold a few copies of an image up
# to `MAX_PIXELS`, so this bounds the server's peak memory; more would not answer sooner,
# as the model call after the decode is one at a time anyway.
DECODE_SLOTS = 2
STATIC = Path(__file__).parent / "static"
CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
log = logging.getLogger("jaxmnist.use.serve")


class Engine:
    """The model behind the API: compiled now, called one request at a time."""

    def __init__(self, model: TrainedModel):
        self.model = model
        self._predict = compile_predict(model, batch_size=1)
        self._lock = threading.Lock()
        self._predict(np.zeros((1, *model.image_shape), np.uint8))  # first call allocates

    def __call__(self, image_u8: np.ndarray) -> np.ndarray:
        """Probabilities float32 (C,) for one uint8 image of the model's input shape."""
        with self._lock:
            return self._predict(image_u8[None])[0]


class SecurityHeaders:
    """ASGI middleware adding `SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def read_body(
    request: Request, limit: int = MAX_BODY_BYTES, drain: int = DRAIN_BYTES
) -> bytes:
    """The request body; 413 if it exceeds `limit` bytes.

    A refused body is still read, and dropped, up to `drain` bytes before the 413 goes
    out. Most clients (urllib, requests) send the whole body before reading; answering
    and closing mid-body makes their writes fail, and the reset that the kernel sends for
    unread data throws away the 413 before they read it. Reading on works for every
    client and keeps the connection usable; it costs reading, not holding, at most
    `drain` bytes. A body declared larger than that is answered at once (reading it all
    would let anyone make the server read without end), as is one whose client waits for
    "100 Continue" before sending it (it then sends nothing: curl does this).
    """
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise HTTPException(400, "malformed Content-Length")
    too_large = HTTPException(413, f"body over the {limit // 1024 // 1024} MB limit")
    if declared is not None and int(declared) > limit:
        waiting = request.headers.get("expect", "").lower() == "100-continue"
        if waiting or int(declared) > drain:
            raise too_large
    body, seen = bytearray(), 0
    try:
        async for chunk in request.stream():
            seen += len(chunk)
            if seen <= limit:
                body += chunk
            elif seen > drain:
                break
    except ClientDisconnect:  # nobody is left to answer; no traceback in the log either
        raise HTTPException(400, "the client left before sending its body") from None
    if seen > limit:
        raise too_large
    return bytes(body)


def parse_input(
    body: bytes,
    content_type: str,
    preprocess_image: bool,
    dataset: str | DatasetSpec = "mnist",
    max_pixels: int | None = MAX_PIXELS,
) -> np.ndarray:
    """uint8 `spec.image_shape` from a request body: image file bytes (made like `dataset`'s
    images, as `predict` makes them), or JSON `{"image": H x W (x C) numbers}` (integers
    0..255, or floats in [0, 1], as the dataset's images are, used as is). DataError for
    anything else; `preprocess.ImageTooLarge` for an image over `max_pixels`."""
    spec = get_spec(dataset)
    dims = "x".join(map(str, spec.image_shape))
    if content_type.split(";")[0].strip().lower() == "application/json":
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"body is not valid JSON ({e})") from None
        except RecursionError:  # the parser recurses once per level of nesting
            raise DataError("body is JSON nested too deeply to parse") from None
        if not isinstance(payload, dict) or "image" not in payload:
            raise DataError(f'JSON body must be an object {{"image": {dims} numbers}}')
        try:
            array = np.asarray(payload["image"])
        except (ValueError, TypeError):
            raise DataError(f"image must be a {dims} array of numbers") from None
        if array.ndim != len(spec.image_shape):
            raise DataError(f"image must be a {dims} array, not shape {array.shape}")
        return preprocess.as_model_input(array, "image", spec.image_shape)[0]
    return preprocess.image_to_model_input(body, "image", preprocess_image, spec, max_pixels)


def create_app(
    model: TrainedModel, allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> Starlette:
    """The application for `model`; compiles the model before returning.

    `allowed_hosts`: Host headers accepted (a page elsewhere cannot reach a
    loopback server through a DNS name it controls); ("*",) accepts any.
    """
    engine = Engine(model)
    # A thread's semaphore, not the event loop's: it works whichever loop runs the app.
    decode_slots = threading.BoundedSemaphore(DECODE_SLOTS)
    spec = get_spec(model.dataset)
    info = {
        **model.info(),
        "height": spec.height,
        "width": spec.width,
        "channels": spec.channels,
        "image_size": spec.describe_shape(),
        "preprocessing": spec.preprocessing,
        # Digits and letters can be drawn on the page's pad; other classes come as photos.
        "handwritten": spec.preprocessing == "mnist",
        "max_body_bytes": MAX_BODY_BYTES,
        "max_pixels": MAX_PIXELS,
    }

    async def page(request: Request):
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def model_info(request: Request):
        return JSONResponse(info)

    async def healthz(request: Request):
        return JSONResponse({"status": "ok"})

    async def predict(request: Request):
        body = await read_body(request)
        flag = request.query_params.get("preprocess", "true").lower()
        if flag not in ("true", "false", "1", "0"):
            raise HTTPException(400, "preprocess must be true or false")
        content_type = request.headers.get("content-type", "application/octet-stream")

        def answer():  # one trip to the thread pool per request: decode, then the model
            with decode_slots:
                image = parse_input(body, content_type, flag in ("true", "1"), spec)
            return image, engine(image)

        try:
            image, probs = await run_in_threadpool(answer)
        except preprocess.ImageTooLarge as e:
            raise HTTPException(413, str(e)) from None
        except DataError as e:
            raise HTTPException(400, str(e)) from None
        reply = {
            "probabilities": [float(p) for p in probs],
            "class_names": list(model.class_names),
            "top": top_k(probs, model.class_names, 3),
            "input": image.tolist(),
        }
        if not preprocess.has_ink(image):  # predicted all the same, as `predict` says too
            reply["warning"] = preprocess.NO_INK
        return JSONResponse(reply)

    async def http_error(request: Request, exc: HTTPException):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    async def server_error(request: Request, exc: Exception):
        log.exception("error while serving %s", request.url.path, exc_info=exc)
        return JSONResponse({"error": "internal error"}, status_code=500)

    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/model", model_info),
            Route("/api/predict", predict, methods=["POST"]),
            Route("/healthz", healthz),
            Mount("/static", StaticFiles(directory=STATIC)),
        ],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
