"""Differential test: `render` of tools/dsuf_text.cc against the deepseek-recipe package
(DeepseekV41Encoding) on randomly generated conversations: identical prompt text and ids.

usage: recipe_render_oracle.py CLI TOKENIZER_JSON [--count N] [--seed S]

The generator stays inside what both sides define the same way; docs/text.md lists where they
differ on purpose (integer efforts, which the recipe cannot take; a trailing non-prefix
assistant, after which the recipe appends a generation header; OpenAI `strict` schemas, which the
recipe rewrites; an empty system message, which the recipe drops), and those are covered by unit tests instead.
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

import deepseek_recipe as dr  # noqa: E402

OUR_IMAGE = "<｜deepseek_image｜>"


def rand_text(r, allow_empty=False):
    if allow_empty and r.random() < 0.15:
        return ""
    gens = [corpus.english, corpus.english, corpus.code, corpus.chinese, corpus.json_text,
            corpus.emoji, corpus.korean, corpus.digits, corpus.whitespace, corpus.special]
    s = "".join(r.choice(gens)(r) for _ in range(r.randint(1, 3)))
    return s[: r.randint(1, 400)] if s else "x"


def rand_value(r, depth=0):
    k = r.random()
    if depth > 2 or k < 0.5:
        return r.choice([rand_text(r)[:40], r.randint(-10**9, 10**9), r.random() * 10 ** r.randint(-8, 20),
                         True, False, None, "", "line1\nline2", "tab\there", "引号\"q\""])
    if k < 0.75:
        return {corpus._word(r): rand_value(r, depth + 1) for _ in range(r.randint(0, 4))}
    return [rand_value(r, depth + 1) for _ in range(r.randint(0, 4))]


def rand_tool(r, name):
    props = {corpus._word(r): {"type": r.choice(["string", "integer", "number", "boolean", "array"]),
                               "description": rand_text(r)[:60]} for _ in range(r.randint(0, 4))}
    params = {"type": "object", "properties": props}
    if props and r.random() < 0.5:
        params["required"] = list(props)[: r.randint(1, len(props))]
    return {"type": "function",
            "function": {"name": name, "description": rand_text(r)[:120], "parameters": params}}


def rand_user_content(r):
    if r.random() < 0.15:
        parts = []
        for _ in range(r.randint(1, 4)):
            if r.random() < 0.3:
                parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
            else:
                parts.append({"type": "text", "text": rand_text(r)})
        return parts
    return rand_text(r)


def conversation(r, idx):
    thinking = r.random() < 0.6
    effort = r.choice([None, "low", "high", "max"])
    tool_names = [f"tool_{corpus._word(r)}_{k}" for k in range(r.randint(1, 3))]
    use_tools = r.random() < 0.4
    msgs = []
    if r.random() < 0.6:
        # An empty system message without tools: the recipe drops it, the official encoder (and
        # we) render <｜System｜>; a unit test covers ours.
        msgs.append({"role": "system", "content": rand_text(r, allow_empty=use_tools)})
    call_id = 0
    turns = r.randint(1, 4)
    for turn in range(turns):
        if turn > 0 and r.random() < 0.1:
            msgs.append({"role": "system", "content": rand_text(r)})
        for _ in range(1 if r.random() < 0.85 else 2):
            msgs.append({"role": "user", "content": rand_user_content(r)})
        last_turn = turn == turns - 1 or r.random() < 0.3
        if last_turn:
            ending = r.random()
            if ending < 0.15 and not use_tools:  # prefix continuation (the recipe forbids it with tools)
                m = {"role": "assistant", "content": rand_text(r, allow_empty=True), "prefix": True}
                if thinking and r.random() < 0.7:
                    m["reasoning_content"] = rand_text(r)
                if not m["content"] and "reasoning_content" not in m:
                    m["content"] = "x"
                msgs.append(m)
            elif ending < 0.3 and use_tools:
                msgs += tool_round(r, tool_names, call_id, thinking)
            break
        # A finished exchange, maybe with tool rounds in between.
        if use_tools and r.random() < 0.5:
            for _ in range(r.randint(1, 2)):
                msgs += tool_round(r, tool_names, call_id, thinking)
                call_id += 10
        a = {"role": "assistant", "content": rand_text(r)}
        if thinking and r.random() < 0.8:
            a["reasoning_content"] = rand_text(r)
        msgs.append(a)
    body = {"messages": msgs, "thinking_mode": "thinking" if thinking else "chat"}
    if effort:
        body["reasoning_effort"] = effort
    if use_tools:
        body["tools"] = [rand_tool(r, n) for n in tool_names]
        if not thinking and r.random() < 0.25:  # the recipe refuses it in thinking mode
            body["tool_choice"] = r.choice(["required", "none", "auto",
                                            {"type": "function", "function": {"name": tool_names[0]}}])
    return body


def tool_round(r, names, base, thinking):
    calls = []
    for k in range(r.randint(1, 3)):
        args = {corpus._word(r): rand_value(r) for _ in range(r.randint(0, 4))}
        calls.append({"id": f"call_{base + k}", "type": "function",
                      "function": {"name": r.choice(names),
                                   "arguments": json.dumps(args, ensure_ascii=r.random() < 0.5)}})
    a = {"role": "assistant", "content": rand_text(r, allow_empty=True), "tool_calls": calls}
    if thinking and r.random() < 0.7:
        a["reasoning_content"] = rand_text(r)
    results = [{"role": "tool", "tool_call_id": c["id"], "content": rand_text(r)} for c in calls]
    r.shuffle(results)
    return [a] + results


def recipe_render(body, tok):
    req = {"model": "m", "messages": body["messages"],
           "thinking": {"type": "enabled" if body["thinking_mode"] == "thinking" else "disabled"}}
    if "reasoning_effort" in body:
        req["reasoning_effort"] = body["reasoning_effort"]
    if "tools" in body:
        req["tools"] = body["tools"]
    if "tool_choice" in body:
        req["tool_choice"] = body["tool_choice"]
    # Our tokenizer file spells id 129264 <｜deepseek_image｜>; the recipe's own file says <｜image｜>.
    sp = dr.SpecialTokens(image=OUR_IMAGE)
    conv = dr.ChatCompletionRequest(req).convert(
        dr.ConversionOptions().with_model_alias("m", dr.ModelVersion.DeepseekV41Flash)
        .with_special_tokens(sp)).conversation
    enc = dr.DeepseekV41Encoding().with_special_tokens(sp)
    return enc.render_conversation(conv).prompt, list(enc.with_tokenizer(tok).encode(conv))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("tokenizer")
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--seed", type=int, default=4141)
    a = ap.parse_args()
    r = random.Random(a.seed)
    tok = dr.Tokenizer.from_file(a.tokenizer)
    bodies, want, rejected = [], [], []
    while len(bodies) < a.count:
        b = conversation(r, len(bodies))
        try:
            want.append(recipe_render(b, tok))
            bodies.append(b)
        except dr.ConversionError as e:  # outside the recipe's accepted shapes: not comparable
            rejected.append(str(e))
    if len(rejected) > a.count // 10:
        sys.exit(f"the generator made {len(rejected)} conversations the recipe rejects: {rejected[:3]}")
    payload = "".join(json.dumps(b, ensure_ascii=False) + "\n" for b in bodies)
    p = subprocess.run([a.cli, "render", "--tokenizer", a.tokenizer], input=payload.encode(),
                       capture_output=True, check=False)
    if p.returncode != 0:
        sys.exit(f"render exited {p.returncode}: {p.stdout.decode()[:1500]} {p.stderr.decode()[:1500]}")
    got = [json.loads(l) for l in p.stdout.decode().split("\n")[:-1]]
    assert len(got) == len(bodies)
    bad = 0
    stats = {"tools": 0, "thinking": 0, "prefix": 0, "images": 0, "tool_results": 0,
             "tool_choice": 0}
    for b, g, (wp, wids) in zip(bodies, got, want):
        stats["tools"] += "tools" in b
        stats["tool_choice"] += "tool_choice" in b
        stats["thinking"] += b["thinking_mode"] == "thinking"
        stats["prefix"] += bool(b["messages"][-1].get("prefix"))
        stats["images"] += OUR_IMAGE in g["prompt"]
        stats["tool_results"] += "<tool_result>" in g["prompt"]
        if g["prompt"] != wp or g["ids"] != wids:
            bad += 1
            if bad <= 3:
                i = next((k for k, (x, y) in enumerate(zip(g["prompt"], wp)) if x != y),
                         min(len(g["prompt"]), len(wp)))
                print(f"MISMATCH: {json.dumps(b, ensure_ascii=False)[:600]}\n  ours  ...{g['prompt'][max(0, i - 80):i + 80]!r}\n"
                      f"  recipe ...{wp[max(0, i - 80):i + 80]!r}\n  ids equal: {g['ids'] == wids}")
                k = next((k for k, (x, y) in enumerate(zip(g["ids"], wids)) if x != y), None)
                if k is not None:
                    print(f"  first differing id at {k}: ours {g['ids'][k - 3:k + 5]} recipe {wids[k - 3:k + 5]}")
    print(f"{len(bodies)} conversations ({stats}; {len(rejected)} more rejected by the recipe "
          f"and skipped), {bad} differ from deepseek-recipe")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
