"""Renders a chat template the way Hugging Face transformers' apply_chat_template does, for the
comparison in chat_templates.rs: jinja2's ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks and the loop-controls extension, the `tojson` filter as json.dumps with
ensure_ascii=False, and the globals raise_exception and strftime_now (here on a fixed clock).

Reads one JSON object on stdin: template, bos_token, eos_token, messages, tools (or null),
add_generation_prompt, now (an ISO 8601 date and time). Writes the rendered text to stdout.
A template that raises exits with status 3 and the message on stderr; jinja2 missing, with
status 2 and how to install it.
"""

import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.stderr.write("jinja2 is not installed: python3 -m pip install jinja2\n")
    sys.exit(2)


def main():
    request = json.load(sys.stdin)
    now = datetime.fromisoformat(request["now"])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        return now.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = env.from_string(request["template"])
    try:
        text = template.render(
            messages=request["messages"],
            tools=request["tools"],
            add_generation_prompt=request["add_generation_prompt"],
            bos_token=request["bos_token"],
            eos_token=request["eos_token"],
        )
    except jinja2.exceptions.TemplateError as e:
        sys.stderr.write(f"{e}\n")
        sys.exit(3)
    sys.stdout.write(text)


main()
