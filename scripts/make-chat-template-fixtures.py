#!/usr/bin/env python3
"""Renders the chat templates in tests/fixtures/chat/*.jinja with jinja2 configured exactly as
`transformers` configures it for `apply_chat_template` (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loop controls, the `{% generation %}` tag, its `tojson`,
`raise_exception`), and writes tests/fixtures/chat/reference.json, which the runtime's chat
template tests compare against byte for byte. These cover template features beyond the HF
model fixtures (tests/fixtures/hf, scripts/make-hf-fixtures.py): namespaces, reversed slices,
Python string and dict methods, `tojson(indent=...)`, thinking blocks, extra variables.

Needs only jinja2 (CI does not run this; the output is committed):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install jinja2
    /tmp/venv/bin/python scripts/make-chat-template-fixtures.py
"""
import json
import pathlib
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

here = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "chat"


# As transformers.utils.chat_template_utils._compile_jinja_template defines them.
class AssistantTracker(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)

messages = [
    {"role": "system", "content": "You are Qwen."},
    {"role": "user", "content": "  What is 2+2?  "},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4", "reasoning_content": None},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}],
    },
    {"role": "tool", "content": '{"t": 21}'},
    {"role": "assistant", "content": "<think>\nok\n</think>\n\nIt is 21."},
]
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]
specials = {"bos_token": "<s>", "eos_token": "</s>"}

cases = []
for path in sorted(here.glob("*.jinja")):
    template = env.from_string(path.read_text())
    for agp in [True, False]:
        for with_tools in [False, True]:
            for extra in [{}, {"enable_thinking": False}]:
                ctx = dict(messages=messages, add_generation_prompt=agp, **specials, **extra)
                if with_tools:
                    ctx["tools"] = tools
                cases.append(
                    {"template": path.name, "add_generation_prompt": agp, "tools": with_tools, "extra": extra, "text": template.render(**ctx)}
                )

out = {"jinja2": jinja2.__version__, "messages": messages, "tools": tools, "specials": specials, "cases": cases}
(here / "reference.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
print(f"{len(cases)} renderings")
