"""A client of your own, in plain Python: one chat completion per record of the shard.

synthbatch runs it once per shard (``[client] command = ["python3", ".../chat_client.py"]``)
with the client contract in its environment (docs/configuration.md, "Command clients"):
SYNTHBATCH_DEPLOYMENTS maps each deployment alias to {"base_url": ".../v1", "model": ...},
ready for any OpenAI client; records go to SYNTHBATCH_OUTPUT_DIR as JSONL with a top-level
"index" (SYNTHBATCH_RECORD_OFFSET onwards), progress to SYNTHBATCH_PROGRESS_FILE.
"""
import json
import os
import time
import urllib.request

env = os.environ
alias, target = sorted(json.loads(env["SYNTHBATCH_DEPLOYMENTS"]).items())[0]
offset, count = int(env["SYNTHBATCH_RECORD_OFFSET"]), int(env["SYNTHBATCH_NUM_RECORDS"])
started, done = time.time(), 0


def progress():
    """Publish the counters (write a temp file, rename it over the old one)."""
    record = {"schema_version": 1, "records_done": done, "records_total": count, "tokens": 0,
              "requests_per_s": done / max(time.time() - started, 1e-6),
              "updated_at": time.time()}
    with open(env["SYNTHBATCH_PROGRESS_FILE"] + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(env["SYNTHBATCH_PROGRESS_FILE"] + ".tmp", env["SYNTHBATCH_PROGRESS_FILE"])


with open(os.path.join(env["SYNTHBATCH_OUTPUT_DIR"], f"part-{offset:09d}.jsonl"), "w") as out:
    for index in range(offset, offset + count):
        prompt = f"Write one sentence about the number {index}."
        body = {"model": target["model"], "max_tokens": 16,
                "messages": [{"role": "user", "content": prompt}]}
        request = urllib.request.Request(target["base_url"] + "/chat/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.load(response)["choices"][0]["message"]["content"]
        out.write(json.dumps({"index": index, "model": alias, "prompt": prompt,
                              "completion": answer}) + "\n")
        done += 1
        progress()
