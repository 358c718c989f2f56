"""OpenAI's own Python client against `hipdecode serve` (crates/cli/tests/serve.rs): one chat
completion without streaming and one streamed, at temperature 0, printed as one JSON object."""

import argparse
import json

import openai


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", required=True)
    p.add_argument("--question", required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=300)
    messages = [{"role": "user", "content": a.question}]
    whole = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=a.max_tokens, temperature=0
    )
    streamed, finish = [], None
    for chunk in client.chat.completions.create(
        model="smollm2",
        messages=messages,
        max_tokens=a.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for choice in chunk.choices:
            if choice.delta.content:
                streamed.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    models = client.models.list()
    print(
        json.dumps(
            {
                "text": whole.choices[0].message.content,
                "finish_reason": whole.choices[0].finish_reason,
                "prompt_tokens": whole.usage.prompt_tokens,
                "streamed": "".join(streamed),
                "streamed_finish_reason": finish,
                "models": [m.id for m in models.data],
            }
        )
    )


if __name__ == "__main__":
    main()
