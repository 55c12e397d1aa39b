"""A command client that uses two models: a writer drafts, a judge scores each draft.

Standard library only; synthbatch runs it once per shard (``[client] command``):

    python3 generate_and_judge.py --writer ALIAS=SERVED_NAME --judge ALIAS=SERVED_NAME \
        [--concurrency N] [--max-tokens N]

It finds both deployments in ``SYNTHBATCH_ENDPOINTS`` (alias -> base URL of the
allocation's proxy for that alias), writes one JSON object per record to
``SYNTHBATCH_OUTPUT_DIR/records.jsonl`` in index order (``index``, ``prompt``,
``completion``, ``score``, ``judgement``), and retries a request that got 429 or a 5xx
a few times (the proxy answers 429 when every replica's queue is full).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Tuple

RETRIES = 5
JUDGE_PROMPT = ("Rate the following answer from 1 (useless) to 10 (excellent). Reply with "
                "the number first, then one sentence.\n\nQuestion: {prompt}\n\nAnswer: "
                "{completion}")


def chat(base: str, model: str, prompt: str, max_tokens: int) -> str:
    """One chat completion; retried on 429 and 5xx."""
    body = json.dumps({"model": model, "max_tokens": max_tokens, "temperature": 0.7,
                       "messages": [{"role": "user", "content": prompt}]}).encode("utf-8")
    for attempt in range(RETRIES + 1):
        request = urllib.request.Request(base + "/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                return json.loads(response.read())["choices"][0]["message"]["content"]
        except urllib.error.HTTPError as err:
            if attempt == RETRIES or not (err.code == 429 or err.code >= 500):
                raise
        time.sleep(min(2 ** attempt, 30))
    raise AssertionError("unreachable")


def record(index: int, ends: Dict[str, str], writer: Tuple[str, str],
           judge: Tuple[str, str], max_tokens: int) -> Dict[str, Any]:
    """Record ``index``: the writer's draft and the judge's score of it."""
    prompt = f"Write a short, self-contained math word problem whose answer is {index}."
    completion = chat(ends[writer[0]], writer[1], prompt, max_tokens)
    judgement = chat(ends[judge[0]], judge[1],
                     JUDGE_PROMPT.format(prompt=prompt, completion=completion), 64)
    score = re.match(r"\s*(\d+)", judgement)
    return {"index": index, "prompt": prompt, "completion": completion,
            "score": int(score.group(1)) if score else None, "judgement": judgement}


def alias_and_name(text: str) -> Tuple[str, str]:
    """``ALIAS=SERVED_NAME`` -> (alias, served name); the name defaults to the alias."""
    alias, _, name = text.partition("=")
    return alias, name or alias


def main() -> int:
    """Write this shard's records in index order."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writer", required=True, type=alias_and_name)
    parser.add_argument("--judge", required=True, type=alias_and_name)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args()
    ends = json.loads(os.environ["SYNTHBATCH_ENDPOINTS"])
    first = int(os.environ["SYNTHBATCH_RECORD_OFFSET"])
    count = int(os.environ["SYNTHBATCH_NUM_RECORDS"])
    out = os.path.join(os.environ["SYNTHBATCH_OUTPUT_DIR"], "records.jsonl")
    with ThreadPoolExecutor(args.concurrency) as pool, open(out, "w", encoding="utf-8") as f:
        rows = pool.map(lambda i: record(i, ends, args.writer, args.judge, args.max_tokens),
                        range(first, first + count))
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"generate_and_judge: {count} records with {sorted(ends)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
