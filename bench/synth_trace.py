#!/usr/bin/env python3
"""Writes a synthetic request trace in the format of shared/workloads/conversation_trace.jsonl,
of another shape than that trace: a few long shared system prompts, multi-turn sessions on top of
them, and one-off documents (a long pasted text, asked about once, a few get follow-ups).

Deterministic for a seed. Each request: timestamp (ms), input_length (tokens), output_length,
hash_ids (512-token prefix blocks; equal ids are the same KV-cache block). As in real prompts,
a turn's last block is partial: the next turn re-hashes it, so its id is never seen again.

    python3 bench/synth_trace.py --out /tmp/synthetic_trace.jsonl [--seed 7] [--minutes 60]
"""
import argparse
import json
import math
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--sessions-per-s", type=float, default=1.2)
    ap.add_argument("--documents-per-s", type=float, default=0.8)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    next_id = [0]

    def new_ids(n):
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    # System prompts: 12 of 4-48 full blocks, popularity Zipf(1.1).
    prompts = [new_ids(rng.randint(4, 48)) for _ in range(12)]
    weights = [1 / (k + 1) ** 1.1 for k in range(len(prompts))]

    end_ms = args.minutes * 60_000
    events = []  # (timestamp, sequence, hash_ids, partial tokens of the last block)
    seq = 0

    def add(ts, chain, tail_tokens):
        nonlocal seq
        if ts < end_ms:
            events.append((int(ts), seq, chain, tail_tokens))
            seq += 1

    def turns_of(start_ms, chain, count, grow_lo, grow_hi, gap_median_s):
        t = start_ms
        for _ in range(count):
            tail = new_ids(1)  # the partial block: its id is gone next turn
            add(t, chain + tail, rng.randint(1, 511))
            chain = chain + new_ids(rng.randint(grow_lo, grow_hi))
            t += 1000 * gap_median_s * math.exp(rng.gauss(0, 0.9))

    # Multi-turn sessions on a system prompt: 1-20 turns (geometric, mean 4), 1-6 new full
    # blocks a turn, turns a minute or so apart.
    t = 0.0
    while t < end_ms:
        t += rng.expovariate(args.sessions_per_s) * 1000
        prompt = rng.choices(prompts, weights)[0]
        turns = min(20, 1 + int(rng.expovariate(1 / 3)))
        turns_of(t, list(prompt) + new_ids(rng.randint(1, 4)), turns, 1, 6, 60)

    # One-off documents: a system prompt and 16-160 blocks of pasted text; 30% get 1-3
    # follow-up questions a few minutes apart, the rest are never seen again.
    t = 0.0
    while t < end_ms:
        t += rng.expovariate(args.documents_per_s) * 1000
        prompt = rng.choices(prompts, weights)[0]
        doc = new_ids(rng.randint(16, 160))
        turns = 1 + (rng.randint(1, 3) if rng.random() < 0.3 else 0)
        turns_of(t, list(prompt) + doc, turns, 1, 2, 180)

    events.sort()
    with open(args.out, "w") as out:
        for ts, _, chain, tail_tokens in events:
            out.write(json.dumps({"timestamp": ts,
                                  "input_length": (len(chain) - 1) * 512 + tail_tokens,
                                  "output_length": rng.randint(20, 600),
                                  "hash_ids": chain}) + "\n")
    print(f"{args.out}: {len(events)} requests, {next_id[0]} distinct blocks")


if __name__ == "__main__":
    main()
