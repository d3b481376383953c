"""200 concurrent streams on the tiny model: every one completes with [DONE] and exactly the text
its prompt gives alone; a full queue answers 429 with Retry-After instead of queueing without bound."""
import concurrent.futures as cf
import json
import threading
import urllib.error
import urllib.request

from conftest import Server, sse_events

PROMPTS = ["Hi", "Hello there", "Count to three", "Why is the sky blue?"]


def stream(port, prompt, max_tokens):
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "thinking": {"type": "disabled"}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        assert r.status == 200
        ev = sse_events(r.read())
    assert ev[-1] == "[DONE]"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in ev[:-1] if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in ev[:-1] if c["choices"] and c["choices"][0]["finish_reason"]]
    return text, finish, ev[-2]["usage"]


def test_200_concurrent_streams_all_complete_and_correct():
    s = Server("--max-batch", "256", "--max-waiting", "512")
    try:
        alone = {p: stream(s.port, p, 4) for p in PROMPTS}
        n = 200
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                m = s.metrics()
                peak[0] = max(peak[0], sum(v for k, v in m.items() if k.startswith("vllm:num_requests_running"))
                              + sum(v for k, v in m.items() if k.startswith("vllm:num_requests_waiting")))
                stop.wait(0.5)

        w = threading.Thread(target=watch)
        w.start()
        with cf.ThreadPoolExecutor(n) as pool:
            results = list(pool.map(lambda i: stream(s.port, PROMPTS[i % len(PROMPTS)], 4), range(n)))
        stop.set()
        w.join()
        for i, (text, finish, usage) in enumerate(results):
            want = alone[PROMPTS[i % len(PROMPTS)]]
            assert (text, finish) == (want[0], ["length"]), f"stream {i}"
            assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] == want[2]["prompt_tokens"]
        assert peak[0] >= 100, f"the server never held more than {peak[0]} requests at once"
    finally:
        assert s.stop() == 0


def test_full_queue_answers_429_with_retry_after():
    s = Server("--max-batch", "1", "--max-waiting", "2")
    try:
        def one(_):
            body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 30,
                               "ignore_eos": True}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{s.port}/v1/chat/completions", data=body)
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return r.status, None, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, e.headers.get("Retry-After"), json.loads(e.read())

        with cf.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
        statuses = sorted(r[0] for r in results)
        assert set(statuses) == {200, 429}, statuses
        assert statuses.count(429) >= 3
        for status, retry, body in results:
            if status == 429:
                assert retry == "1"
                assert body["error"]["type"] == "rate_limit_error"
                assert "waiting" in body["error"]["message"]
            else:
                assert body["usage"]["completion_tokens"] == 30
    finally:
        assert s.stop() == 0
