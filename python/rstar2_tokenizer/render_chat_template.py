"""Render chat templates with Python Jinja2 configured the way transformers' apply_chat_template does
(sandboxed, trim_blocks, lstrip_blocks, loopcontrols, tojson without key sorting or ASCII escaping).

Used by test/tokenizer to check that the TypeScript renderer (@huggingface/jinja) produces the same bytes.
stdin: {"template": str, "cases": [{"messages", "tools", "add_generation_prompt", "vars"}]}
stdout: JSON list of rendered strings.
"""

import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    req = json.load(sys.stdin)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    tpl = env.from_string(req["template"])
    out = []
    for case in req["cases"]:
        kw = dict(case.get("vars") or {})
        kw.update(messages=case["messages"], add_generation_prompt=case.get("add_generation_prompt", False))
        if case.get("tools"):
            kw["tools"] = case["tools"]
        out.append(tpl.render(**kw))
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
