"""The official openai client against the real server: streaming and not, thinking on and off,
exact usage, the streaming invariants, tools (round trip through history), seeds, stop strings."""
import json
import time

import openai
import pytest

from conftest import sse_events

CHAT = {"type": "disabled"}
THINK = {"type": "enabled"}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=120, max_retries=0)


def chat_prompt_len(tokenizer, text):
    # BOS <｜User｜> text <｜Assistant｜> </think>: four control tokens around the plain BPE.
    return 4 + len(tokenizer.encode(text, add_special_tokens=False).ids)


def test_non_streaming_chat_mode_exact_usage(client, tokenizer):
    r = client.chat.completions.create(model="deepseek-v4-flash", messages=[{"role": "user", "content": "Hello there"}],
                                       max_tokens=5, temperature=0, extra_body={"thinking": CHAT})
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == "deepseek-v4-flash"
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert not getattr(c.message, "reasoning_content", None)
    assert r.usage.prompt_tokens == chat_prompt_len(tokenizer, "Hello there")
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 5
    else:  # EOS within 5 tokens is possible for random weights; it is still counted
        assert c.finish_reason == "stop" and 1 <= r.usage.completion_tokens <= 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_non_streaming_thinking_mode_has_reasoning(client):
    r = client.chat.completions.create(model="deepseek-v4-flash", messages=[{"role": "user", "content": "Why?"}],
                                       max_tokens=6, temperature=0, extra_body={"thinking": THINK})
    msg = r.choices[0].message
    # The tiny model's weights are random: it never closes </think> this early, so it all is reasoning.
    assert isinstance(msg.reasoning_content, str) and msg.reasoning_content
    assert r.usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens
    # Thinking mode prompt: BOS <｜System｜> effort line ... <｜Assistant｜><think>
    assert r.usage.prompt_tokens > 20


def test_streaming_invariants_and_usage(server, tokenizer):
    body = {"model": "x", "messages": [{"role": "user", "content": "Count"}], "max_tokens": 7, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "thinking": CHAT}
    status, headers, raw = server.request("POST", "/v1/chat/completions", body)
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    ev = sse_events(raw)
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert len({c["id"] for c in chunks}) == 1
    assert len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "x" for c in chunks)
    first = chunks[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    assert first["finish_reason"] is None
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == chat_prompt_len(tokenizer, "Count")
    final = chunks[-2]["choices"][0]
    assert final["finish_reason"] in ("length", "stop") and final["delta"] == {}
    body_chunks = chunks[1:-2]
    assert all(c["choices"][0]["finish_reason"] is None for c in body_chunks)
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    # Non-streaming with the same greedy request gives the same text and usage.
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in body_chunks)
    body.pop("stream")
    body.pop("stream_options")
    status, _, r = server.chat(body)
    assert status == 200
    assert r["choices"][0]["message"]["content"] == text
    assert r["usage"]["completion_tokens"] == usage["usage"]["completion_tokens"]


def test_openai_streaming_thinking(client):
    stream = client.chat.completions.create(
        model="deepseek-v4-flash", messages=[{"role": "user", "content": "Think"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True}, extra_body={"thinking": THINK, "reasoning_effort": "max"})
    chunks = list(stream)
    first = chunks[0].choices[0].delta
    assert first.role == "assistant"
    assert first.model_extra.get("reasoning_content") == ""
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices)
    assert reasoning
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 5


def test_same_seed_same_output_other_seed_differs(client):
    def run(seed):
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Tell a story"}],
                                           max_tokens=12, temperature=1.0, seed=seed, extra_body={"thinking": CHAT})
        return r.choices[0].message.content
    a, b, c = run(1234), run(1234), run(99)
    assert a == b
    assert a != c  # 12 tokens sampled over a 129,280-token vocabulary at temperature 1


def test_stop_string_cuts_content(client):
    base = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Go"}], max_tokens=12,
                                          temperature=0, extra_body={"thinking": CHAT, "ignore_eos": True})
    text = base.choices[0].message.content
    assert len(text) > 6
    stop = text[len(text) // 2:len(text) // 2 + 3]
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Go"}], max_tokens=12,
                                       temperature=0, stop=[stop], extra_body={"thinking": CHAT, "ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[:text.index(stop)]
    assert r.usage.completion_tokens < 12


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}]


def test_tool_round_trip_through_history(client):
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Weather in Beijing?"}]
    r1 = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=4,
                                        extra_body={"thinking": THINK})
    assert r1.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The client sends back an assistant turn with a tool call (and its reasoning) plus the result.
    msgs += [{"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
              "tool_calls": [{"id": "call_1", "type": "function",
                              "function": {"name": "get_weather", "arguments": json.dumps({"location": "Beijing"})}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp_c": 22})}]
    r2 = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, tool_choice="auto", max_tokens=4,
                                        stream=True, stream_options={"include_usage": True},
                                        extra_body={"thinking": THINK})
    chunks = list(r2)
    assert chunks[-1].usage.prompt_tokens > r1.usage.prompt_tokens + 30
    # Without tools the same history is still accepted (tool results become user turns).
    r3 = client.chat.completions.create(model="m", messages=msgs, max_tokens=2, extra_body={"thinking": CHAT})
    assert r3.usage.completion_tokens >= 1


def test_tool_schema_errors_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       tools=[{"type": "function", "function": {"description": "no name"}}])
    assert "tools[0].function.name" in str(e.value)


def test_models_and_probes(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["deepseek-v4-flash"]
    assert server.request("GET", "/livez")[0] == 200
    assert server.request("GET", "/readyz")[0] == 200
    assert server.request("GET", "/health")[0] == 200
    assert server.request("POST", "/chat/completions",
                          {"messages": [{"role": "user", "content": "bare path"}], "max_tokens": 1})[0] == 200


def test_metrics_follow_the_requests(server):
    # A request cut by a stop string earlier may still take its last step after its response went out.
    deadline = time.time() + 10
    while server.metric("vllm:num_requests_running") != 0:
        assert time.time() < deadline
        time.sleep(0.01)
    before = server.metrics()
    status, _, r = server.chat({"messages": [{"role": "user", "content": "m"}], "max_tokens": 3, "ignore_eos": True,
                                "thinking": CHAT})
    assert status == 200
    after = server.metrics()
    lab = '{model_name="deepseek-v4-flash"}'
    assert after["vllm:generation_tokens_total" + lab] - before["vllm:generation_tokens_total" + lab] == 3
    assert after["vllm:prompt_tokens_total" + lab] - before["vllm:prompt_tokens_total" + lab] == r["usage"]["prompt_tokens"]
    assert after["vllm:time_to_first_token_seconds_count" + lab] - before["vllm:time_to_first_token_seconds_count" + lab] == 1
    assert after["vllm:inter_token_latency_seconds_count" + lab] - before["vllm:inter_token_latency_seconds_count" + lab] == 2
    assert after["vllm:num_requests_running" + lab] == 0
    assert after["vllm:num_requests_waiting" + lab] == 0
    assert after["vllm:kv_cache_usage_perc" + lab] == 0
    assert 'vllm:request_success_total{model_name="deepseek-v4-flash",finished_reason="length"}' in after
