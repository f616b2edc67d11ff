#!/usr/bin/env python3
"""The chat-template test cases (tests/model/data/chat_template_cases.json), rendered by Jinja2
itself configured as transformers' apply_chat_template configures it: ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and loop controls; tojson as json.dumps(ensure_ascii=False);
raise_exception; the special tokens and messages/tools/documents/add_generation_prompt as the
render variables. fp4kv's template engine (fp4kv/model/jinja.h) must give the same text, or
fail where Jinja2 fails.

    python3 tests/model/make_chat_template_fixture.py   (from the repository root; needs jinja2)
"""
import json
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "chat_template_cases.json")


class Raised(Exception):
    pass


def environment():
    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


# A template in the form of Qwen3's (thinking blocks kept only after the last user query,
# tool calls and responses in ChatML).
QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

# In the form of Qwen2.5's: a default system prompt, tool calls as JSON.
QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# In the form of Llama 3's: BOS, headers, trimmed content.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
          "+ message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# In the form of Mistral's: strict alternation, raise_exception, a system prompt folded in.
MISTRAL = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

# The language beyond the model templates: macros, filters, tests, loops, literals, numbers.
FEATURES = r"""{%- macro show(x, label='v') -%}
{{ label }}={{ x }};
{%- endmacro -%}
{% set ns = namespace(total=0, names=[]) %}
{% for m in messages %}
{{ loop.index }}/{{ loop.length }} {{ loop.revindex0 }} {{ m.role|upper }} {{ m.content|length }}
{% set ns.total = ns.total + m.content|length %}
{% set ns.names = ns.names + [m.role] %}
{% if loop.previtem is defined %}prev={{ loop.previtem.role }}{% endif %}
{% endfor %}
total={{ ns.total }} names={{ ns.names|join(',') }} unique={{ ns.names|unique|list|tojson }}
{{ show(messages|length) }}{{ show(label='n', x=messages[-1].role) }}
{% for k, v in {'b': 1, 'a': [1, 2.5, none, true]}.items() %}{{ k }}:{{ v|tojson }} {% endfor %}

{{ {'z': 1, 'a': {'y': 'é"\n'}}|tojson(indent=2, sort_keys=true) }}
{{ messages|map(attribute='role')|list }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}
{{ messages|rejectattr('role', 'in', ['system'])|map(attribute='role')|join('|') }}
{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ [1, 2, 3]|sum }}
{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 3 * 'ab' }}
{{ 'a' ~ 1 ~ none ~ true }} {{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} {{ 4 not in [1, 2] }} {{ 3 is odd }} {{ 10 is divisibleby 5 }}
{{ 'x' if false }}|{{ 'x' if false else 'y' }}|{{ none is none }}|{{ undefined_name is defined }}|{{ undefined_name|default('d') }}
{{ '  pad  '|trim }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}
{{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ [1, 2, 3, 4][1::2] }} {{ [1, 2, 3][-1] }} {{ 'abc'|first }} {{ [1, 2]|last }}
{{ 'Hello World'.lower() }} {{ 'hello world'|title }} {{ 'hello'|capitalize }} {{ 'a-b-c'.replace('-', '+') }} {{ 'abc'.find('c') }}
{% for i in range(10) %}{% if i is even %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}
{% for x in [] %}never{% else %}empty{% endfor %} {% for x in [1, 2, 3, 4] if x > 2 %}{{ loop.index }}{{ x }}{% endfor %}
{% set a, b = 1, 2 %}{{ a }}{{ b }} {{ (1, 2) }} {{ [1, 'a', none, 1.5, {'k': 'v'}] }} {{ "it's" }} {{ ['q"', "it's"] }}
{% set block %}inner {{ 1 + 1 }}{% endset %}{{ block|upper }} {{ 'line1\nline2'|indent(2) }}
{% raw %}{{ not rendered }}{% endraw %}
{{ '%s'|length }} {{ 3.0|int }} {{ '42'|int + 1 }} {{ '2.5'|float }} {{ -3|abs }} {{ 2.567|round(2) }}
"""

# Whitespace control and lstrip/trim corner cases, each rendered with the same variables.
WHITESPACE = [
    "  {% if true %}\n  x\n  {% endif %}\n  y {# c #}\n  {# c2 #}\nz",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "a\n  {%+ if true %}b{% endif %}\n",
    "{{ 'x' }}\n{{ 'y' -}}\n\n  z\n",
    "line\n    {% for i in [1, 2] %}\n    item {{ i }}\n    {% endfor %}\nend\n\n",
    "{# only a comment #}\n{%- set x = 1 -%}\n\t{{ x }}\t\n",
    "a\r\nb\r\n{% if true %}\r\nc\r\n{% endif %}\r\n",
    "{{- ' lead' }} {{ 'mid' -}}   \n  {{- 'end' }}",
    "x {% if true %} y {% endif %} z\n  {% if false %}no{% else %}\n  yes\n  {% endif %}",
]

# Templates that must fail (syntax or render errors), and a conversation to render them with.
FAILING = [
    "{{ undefined_name.attribute }}",
    "{{ 'a' + undefined_name }}",
    "{{ 1 // 0 }}",
    "{% if true %}unclosed",
    "{{ messages[0].role ",
    "{% include 'other.jinja' %}",
    "{{ raise_exception('custom refusal') }}",
    "{{ 1 + 'a' }}",
    "{% for a, b in [1, 2] %}{% endfor %}",
    "{% endif %}",
]

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue?"}],
    "multi_turn_thinking": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
    ],
    "reasoning_field": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "\nthought\n"},
    ],
    "tools": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "second"},
        {"role": "assistant", "content": "It is 21 °C."},
        {"role": "user", "content": "Thanks"},
    ],
    "unicode_quotes": [{"role": "user", "content": "  «Grüße» — 'single' \"double\" \\ back\n\ttab 日本語 🙂  "}],
    "bad_alternation": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"]}}}]

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def render(env, template, variables):
    try:
        return {"expected": env.from_string(template).render(**variables)}
    except Raised as e:
        return {"raised": str(e)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": type(e).__name__ + ": " + str(e)}
    except (TypeError, ZeroDivisionError, ValueError) as e:
        return {"error": type(e).__name__ + ": " + str(e)}


def main():
    env = environment()
    cases = []
    models = {"qwen3": QWEN3, "qwen25": QWEN25, "llama3": LLAMA3, "mistral": MISTRAL, "features": FEATURES}
    for tname, template in models.items():
        for cname, messages in CONVERSATIONS.items():
            for gen in (True, False):
                for extra in ({}, {"enable_thinking": False}):
                    tools = TOOLS if cname == "tools" and tname.startswith("qwen") else None
                    variables = dict(SPECIALS, **extra)
                    variables.update(messages=messages, tools=tools, documents=None, add_generation_prompt=gen)
                    case = {"name": f"{tname}/{cname}/gen{int(gen)}/{'nothink' if extra else 'default'}",
                            "template": tname, "specials": SPECIALS, "messages": messages, "tools": tools,
                            "variables": extra, "add_generation_prompt": gen}
                    case.update(render(env, template, variables))
                    cases.append(case)
    snippets = {}
    for i, t in enumerate(WHITESPACE + FAILING):
        name = f"snippet{i}"
        snippets[name] = t
        variables = dict(SPECIALS, messages=CONVERSATIONS["system_user"], tools=None, documents=None,
                         add_generation_prompt=True)
        case = {"name": name, "template": name, "specials": SPECIALS, "messages": CONVERSATIONS["system_user"],
                "tools": None, "variables": {}, "add_generation_prompt": True}
        case.update(render(env, t, variables))
        cases.append(case)
    templates = dict(models, **snippets)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "templates": templates, "cases": cases}, f, ensure_ascii=False, indent=1)
    outcomes = {}
    for c in cases:
        k = "expected" if "expected" in c else "raised" if "raised" in c else "error"
        outcomes[k] = outcomes.get(k, 0) + 1
    print(f"{len(cases)} cases -> {OUT}: {outcomes}")


if __name__ == "__main__":
    main()
