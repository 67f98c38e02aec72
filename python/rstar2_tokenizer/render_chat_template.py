"""Render chat templates with Python Jinja2 configured the way transformers' apply_chat_template does
(sandboxed, trim_blocks, lstrip_blocks, loopcontrols, tojson without key sorting or ASCII escaping).

Used by test/tokenizer to check that the TypeScript renderer (@huggingface/jinja) produces the same bytes.
stdin: {"template": str, "cases": [{"messages", "tools", "add_generation_prompt", "vars"}]}
stdout: JSON list of rendered strings.
"""

import json
import resource
import signal
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


# A template is untrusted input: bound the render's time and memory, and say which limit stopped it.
TIME_LIMIT_S = 30
MEMORY_LIMIT_BYTES = 2 << 30


def on_alarm(_signum, _frame):
    raise TimeoutError(f"chat template render took over {TIME_LIMIT_S} s")


def main():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TIME_LIMIT_S)
    try:
        render(json.load(sys.stdin))
    except MemoryError:
        sys.exit(f"chat template render needed over {MEMORY_LIMIT_BYTES >> 30} GiB")
    except TimeoutError as e:
        sys.exit(str(e))


def render(req):
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
