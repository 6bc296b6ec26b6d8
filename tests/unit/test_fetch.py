"""Media by URL (graphc/serve/fetch.py, graphc run --media-urls): a loopback web server stands in for
the web; the fetcher is told that only 127.0.0.1 is "public" where a test needs a fetch to succeed, and
keeps its default (public addresses only) where it must refuse."""
import http.server
import threading
import time

import pytest

from graphc.errors import InvalidInput
from graphc.serve.fetch import Fetcher, public
from graphc.runtime.inputs import Sources, split_messages
from tests.unit.test_hostile_input import png

PNG = png(8, 8)
hits: list[str] = []


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        hits.append(self.path)
        if self.path == "/img.png":
            body = PNG
        elif self.path == "/big":
            body = b"\0" * 5000
        elif self.path == "/lying":                     # no Content-Length: read until over the limit
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"\0" * 5000)
            return
        elif self.path.startswith("/to/"):             # a redirect to what follows /to/
            self.send_response(302)
            self.send_header("Location", self.path[4:])
            self.end_headers()
            return
        elif self.path == "/loop":
            self.send_response(301)
            self.send_header("Location", "/loop")
            self.end_headers()
            return
        elif self.path == "/slow":
            time.sleep(1.5)
            body = PNG
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except BrokenPipeError:                        # /slow: the fetcher gave up first
            pass


@pytest.fixture(scope="module")
def site():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def loopback_ok(**kw) -> Fetcher:
    return Fetcher(allowed=lambda ip: ip == "127.0.0.1", **kw)


def refused(fetch, url, words):
    with pytest.raises(InvalidInput, match=words):
        fetch(url, "image")


def test_public_addresses_only():
    for ip in ["127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.5.4", "169.254.169.254", "100.64.0.1", "0.0.0.0",
               "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "224.0.0.1", "240.0.0.1"]:
        assert not public(ip), ip
    for ip in ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]:
        assert public(ip), ip


def test_a_fetch_within_the_limits(site):
    assert loopback_ok()(site + "/img.png") == PNG
    assert loopback_ok()(site + "/to//img.png") == PNG                    # a redirect to an allowed address


def test_loopback_and_private_addresses_are_refused_by_default(site):
    hits.clear()
    refused(Fetcher(), site + "/img.png", "is at 127.0.0.1, which this server does not reach")
    refused(Fetcher(), "http://localhost:1/x", "which this server does not reach")
    assert not hits                                                      # refused before connecting


def test_a_redirect_to_a_private_address_is_not_followed(site):
    hits.clear()
    refused(loopback_ok(), site + "/to/http://169.254.169.254/latest/meta-data",
            "is at 169.254.169.254, which this server does not reach")
    refused(loopback_ok(), site + "/to/http://10.0.0.1:8080/", "is at 10.0.0.1, which this server does not reach")
    refused(loopback_ok(), site + "/to/file:///etc/passwd", "not an http")
    assert hits == ["/to/http://169.254.169.254/latest/meta-data", "/to/http://10.0.0.1:8080/", "/to/file:///etc/passwd"]


def test_size_time_and_redirect_limits(site):
    refused(loopback_ok(max_bytes=4000), site + "/big", "5,000 bytes, over the 4,000")
    refused(loopback_ok(max_bytes=4000), site + "/lying", "over the 4,000 bytes")
    t = time.perf_counter()
    refused(loopback_ok(timeout=0.5), site + "/slow", "more than 0.5 s")
    assert time.perf_counter() - t < 1.4
    refused(loopback_ok(), site + "/loop", "redirects more than 3 times")
    refused(loopback_ok(), site + "/missing", "HTTP 404")
    refused(loopback_ok(), "http://user:pw@127.0.0.1/x", "user name or password")
    refused(loopback_ok(), "http://no-such-host.invalid/x", "does not resolve")


def test_messages_fetch_only_when_enabled(site):
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": site + "/img.png"}}]}]
    with pytest.raises(InvalidInput, match="fetches no URLs"):
        split_messages(msgs, sources=Sources(paths=False))
    out, media = split_messages(msgs, sources=Sources(paths=False, urls=loopback_ok()))
    assert out[0]["content"] == [{"type": "image"}] and tuple(media[0].data.shape) == (3, 8, 8)
