"""Runs inside the onnxruntime-genai venv: greedy generation over chat prompts, batch by batch.

    python ortgenai_driver.py MODEL_DIR PROMPTS.json BATCH MAX_NEW_TOKENS   -> JSON on stdout

PROMPTS.json holds chat-templated prompt texts (rendered by blockdraft with the same template).
Prints {"seconds": [...per batch], "tokens": [[...generated ids per prompt]]}.
"""

import json
import sys
import time

import onnxruntime_genai as og


def main() -> None:
    model_dir, prompts_path, batch, max_new = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    texts = json.loads(open(prompts_path).read())
    model = og.Model(model_dir)
    tok = og.Tokenizer(model)
    seconds, outputs = [], []
    for lo in range(0, len(texts), batch):
        group = texts[lo:lo + batch]
        t0 = time.perf_counter()
        ids = tok.encode_batch(group)                      # [batch, longest] (padded)
        prefix = ids.shape()[1]
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=prefix + max_new, batch_size=len(group))
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        seconds.append(time.perf_counter() - t0)
        for i in range(len(group)):
            outputs.append([int(t) for t in gen.get_sequence(i)[prefix:]])
    print(json.dumps({"seconds": seconds, "tokens": outputs}))


if __name__ == "__main__":
    main()
