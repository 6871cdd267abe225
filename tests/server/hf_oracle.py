"""Runs in the PyTorch environment (Python 3.11, torch + transformers): loads a `peertrain export --format hf`
folder with transformers and answers for the same prompts as the runtime did (logits, greedy tokens, ids)."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast


def main(folder: str, inputs: str, outputs: str) -> None:
    data = np.load(inputs)
    prompts = json.loads(str(data["prompts"]))
    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    with torch.no_grad():
        logits = model(torch.from_numpy(data["batch"].astype(np.int64))).logits.numpy()
        greedy = []
        for prompt in prompts:
            ids = torch.tensor([tokenizer.encode(prompt)])
            out = model.generate(ids, max_new_tokens=int(data["new_tokens"]), do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
            greedy.append(out[0].tolist())
    encoded = [tokenizer.encode(prompt) for prompt in prompts]
    decoded = [tokenizer.decode(ids) for ids in encoded]
    np.savez(outputs, logits=logits, greedy=json.dumps(greedy), encoded=json.dumps(encoded),
             decoded=json.dumps(decoded))


if __name__ == "__main__":
    main(*sys.argv[1:4])
