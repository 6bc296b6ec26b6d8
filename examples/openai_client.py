"""Call a running `graphc run` server with the official `openai` client: list the models, one chat
completion, and the same chat streamed.

    graphc run tiny_omni.plan --checkpoint ckpt/tiny_omni          # in another shell (README.md, "Run")
    python examples/openai_client.py --base-url http://127.0.0.1:8000/v1

--api-key is the server's --api-key (default: $GRAPHC_API_KEY, else any text: a server started without a
key takes every request). --model defaults to the first model the server lists. Prints the models, the
completion's text, finish reason and token usage, then the streamed text as it arrives and the stream's
finish reason and usage (the server's last chunk, asked for with stream_options include_usage).
"""
from __future__ import annotations

import argparse
import os
import sys

from openai import OpenAI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server's URL, ending in /v1")
    ap.add_argument("--api-key", default=os.environ.get("GRAPHC_API_KEY", "none"))
    ap.add_argument("--model", default=None, help="default: the first model the server lists")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt", default="hello world, how are you today?")
    args = ap.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=120, max_retries=0)

    models = [m.id for m in client.models.list()]            # GET /v1/models
    print(f"models: {', '.join(models)}")
    model = args.model or models[0]
    messages = [{"role": "user", "content": args.prompt}]

    done = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                          temperature=0)
    choice = done.choices[0]
    print(f"chat: {choice.message.content!r} (finish_reason {choice.finish_reason}, {done.usage.prompt_tokens} "
          f"prompt + {done.usage.completion_tokens} completion tokens)")

    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    print("stream: ", end="", flush=True)
    text, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:                           # the last chunk: usage, no choices
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                text.append(c.delta.content)
                print(repr(c.delta.content), end=" ", flush=True)
            finish = c.finish_reason or finish
    print(f"\nstream: {''.join(text)!r} (finish_reason {finish}, {usage.completion_tokens} completion tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
