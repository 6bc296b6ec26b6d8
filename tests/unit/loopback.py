"""graphc run's server on a free loopback port, for the tests that drive it with the openai client."""
import socket
import threading
import time


def serve(engine, **app_kwargs):
    """build_app(engine, **app_kwargs) served by uvicorn on a free loopback port: (server, port). Stop it with
    server.should_exit = True."""
    import uvicorn

    from graphc.serve import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(engine, **app_kwargs), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    return server, port


def tiny_omni(d, speech: bool = False):
    """A tiny Qwen3-Omni checkpoint (d/ckpt; with talker and Code2Wav when speech, its weights re-drawn so the
    talker speaks) and its CPU plan (d/p.plan), as the server tests serve it: d."""
    tiny_omni_hf(d, seed=3 if speech else None, speech=speech)
    return d


def tiny_omni_hf(d, seed: int | None, speech: bool = False):
    """tiny_omni's checkpoint and plan in d, its weights re-drawn with `seed` (None: HF's defaults): (the HF model
    in eval mode, its tokenizer), the independent reference of tests that compare with HF."""
    from examples.make_tiny_checkpoint import build_tokenizer, omni_model, save
    from graphc.cli import main

    tok = build_tokenizer()
    hf = omni_model(tok, speech=speech)
    if seed is not None:
        from tests.parity.weights import randomize
        randomize(hf, seed=seed)
    save(hf, tok, d / "ckpt")
    assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--checkpoint", str(d / "ckpt"), "--gpu", "cpu",
                 "-o", str(d / "p.plan"), "-q"]) == 0
    return hf.eval(), tok


def post(port: int, path: str, body: dict) -> tuple[int, dict]:
    """POST a JSON body to the loopback server: (status, the JSON answer), an error status included."""
    import json
    from urllib.error import HTTPError
    from urllib.request import Request, urlopen

    req = Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urlopen(req) as r:
            return r.status, json.loads(r.read())
    except HTTPError as e:
        return e.code, json.loads(e.read())


async def drop_after(port: int, path: str, body: dict, after_bytes: int) -> None:
    """A client that POSTs a streaming request, reads about `after_bytes` of the answer and closes its socket
    (a client that goes away mid-stream, as a browser tab or a killed process does)."""
    import asyncio
    import json

    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    got = 0
    while got < after_bytes:
        piece = await reader.read(256)
        if not piece:
            break
        got += len(piece)
    writer.close()


def answer_to_header(port: int, path: str, length: int, timeout: float = 10) -> tuple[int, dict]:
    """A POST's request line and headers, its Content-Length `length`, and no byte of its body: (status, the JSON
    answer) where the server answers from the header alone. (A client that sends such a body while the server
    answers 413 and closes may see a broken pipe, or a reset that drops the answer, instead of the answer.)"""
    import json
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {length}\r\n\r\n".encode())
        answer = b""
        while b"}}" not in answer:
            part = sock.recv(4096)
            if not part:
                break
            answer += part
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def post_json(port: int, path: str, body, *, headers: dict | None = None, timeout: float = 120):
    """POST a JSON body (or raw bytes) to the loopback server: (status, the JSON answer, headers with
    lower-case names), errors included."""
    import json
    import urllib.request
    from urllib.error import HTTPError

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), {k.lower(): v for k, v in r.headers.items()}
    except HTTPError as e:
        return e.code, json.loads(e.read()), {k.lower(): v for k, v in e.headers.items()}
