"""Bad input over raw HTTP: each gets the OpenAI error JSON, the right status and a message naming
the problem; a client that vanishes mid-stream is cancelled; the server keeps serving everyone."""
import json
import socket
import time

import pytest

from conftest import Server

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def srv():
    s = Server("--request-timeout", "1", "--max-body-bytes", "65536", "--max-context", "256")
    yield s
    assert s.stop() == 0


def error_of(status, body, want_status):
    assert status == want_status, body
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    return err


@pytest.mark.parametrize("body,param,words", [
    ("{not json", None, "not valid JSON"),
    ("[1, 2]", None, "must be a JSON object"),
    ("", None, "not valid JSON"),
    ({"messages": "hi"}, "messages", "must be an array"),
    ({"messages": []}, "messages", "must not be empty"),
    ({}, "messages", "messages is required"),
    ({"messages": [{"content": "x"}]}, "messages[0].role", "required"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "wizard"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or an array"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "required"),
    ({"messages": MSG, "temperature": "hot"}, "temperature", "must be a number"),
    ({"messages": MSG, "temperature": 7}, "temperature", "[0, 2]"),
    ({"messages": MSG, "top_p": 0}, "top_p", "greater than 0"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"messages": MSG, "max_tokens": "ten"}, "max_tokens", "integer"),
    ({"messages": MSG, "stream": "yes"}, "stream", "boolean"),
    ({"messages": MSG, "stop": [1]}, "stop", "strings"),
    ({"messages": MSG, "n": 2}, "n", "n must be 1"),
    ({"messages": MSG, "logprobs": True}, "logprobs", "not supported"),
    ({"messages": MSG, "logit_bias": {"5": 10}}, "logit_bias", "not supported"),
    ({"messages": MSG, "thinking": {"type": "sometimes"}}, "thinking", "enabled"),
    ({"messages": MSG, "tool_choice": "always"}, "tool_choice", "tool_choice"),
    ({"messages": MSG, "reasoning_effort": "extreme"}, None, "effort"),
])
def test_bad_bodies_get_400_naming_the_problem(srv, body, param, words):
    status, headers, data = srv.request("POST", "/v1/chat/completions", body)
    err = error_of(status, data, 400)
    assert headers["content-type"] == "application/json"
    assert err["type"] == "invalid_request_error"
    assert words.lower() in err["message"].lower(), err["message"]
    if param:
        assert err["param"] == param


def test_prompt_longer_than_context(srv):
    long = " ".join(["word"] * 400)  # > 256 tokens
    status, _, data = srv.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": long}]})
    err = error_of(status, data, 400)
    assert err["code"] == "context_length_exceeded"
    assert "256" in err["message"]


def test_oversized_body_413(srv):
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 100000}]})
    status, _, data = srv.request("POST", "/v1/chat/completions", big)
    err = error_of(status, data, 413)
    assert "65536" in err["message"]


def raw(srv, payload, wait_close=5.0):
    """Sends raw bytes, returns whatever comes back until the server closes."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=wait_close)
    try:
        s.sendall(payload)
        out = b""
        while True:
            try:
                d = s.recv(65536)
            except socket.timeout:
                break
            if not d:
                break
            out += d
        return out
    finally:
        s.close()


def status_and_body(resp):
    head, _, body = resp.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_stalled_sender_gets_408(srv):
    t0 = time.time()
    resp = raw(srv, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"messa")
    status, body = status_and_body(resp)
    assert status == 408
    assert "did not arrive" in json.loads(body)["error"]["message"]
    assert time.time() - t0 < 4


def test_stalled_headers_get_408(srv):
    status, _ = status_and_body(raw(srv, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"))
    assert status == 408


def test_malformed_http_gets_400(srv):
    status, body = status_and_body(raw(srv, b"HELLO THERE\r\n\r\n"))
    assert status == 400
    assert json.loads(body)["error"]["message"].startswith("malformed HTTP request")


def test_unknown_route_and_method(srv):
    status, _, data = srv.request("GET", "/v2/whatever")
    assert error_of(status, data, 404)["code"] == "not_found"
    status, _, data = srv.request("GET", "/v1/chat/completions")
    assert error_of(status, data, 405)["message"] == "/v1/chat/completions accepts POST only"
    status, _, data = srv.request("POST", "/metrics", "{}")
    assert status == 405


def test_client_vanishing_mid_stream_cancels_at_once(srv):
    before = srv.metric("dsuf:client_disconnects_total")
    body = json.dumps({"messages": MSG, "max_tokens": 200, "stream": True, "ignore_eos": True,
                       "thinking": {"type": "disabled"}}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:  # the role chunk and two tokens: it is decoding
        got += s.recv(65536)
    assert srv.metric("vllm:num_requests_running") == 1
    s.close()
    deadline = time.time() + 3
    while srv.metric("vllm:num_requests_running") != 0:
        assert time.time() < deadline, "the request kept running after its client left"
        time.sleep(0.02)
    assert srv.metric("vllm:kv_cache_usage_perc") == 0
    assert srv.metric("dsuf:client_disconnects_total") == before + 1
    assert any("(client gone)" in line for line in srv.log)


def test_server_still_serves_after_all_that(srv):
    status, _, r = srv.chat({"messages": MSG, "max_tokens": 2})
    assert status == 200 and r["usage"]["completion_tokens"] >= 1


def test_keep_alive_connection_serves_several_requests(srv):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    for _ in range(3):
        conn.request("POST", "/v1/chat/completions", json.dumps({"messages": MSG, "max_tokens": 1, "stream": True}))
        r = conn.getresponse()
        assert r.status == 200
        assert r.read().endswith(b"data: [DONE]\n\n")
    conn.close()


def test_expect_100_continue(srv):
    body = json.dumps({"messages": MSG, "max_tokens": 1}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")
    finally:
        s.close()
