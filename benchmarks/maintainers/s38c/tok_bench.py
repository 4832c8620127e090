"""Scratch (session 38): a tokenizer.json's cost in a request's plan — 160 strings (32 questions of 4
candidates, as the standard workloads) encoded one call each, as plan_request does, against one
encode_batch, with a synthetic byte-level BPE of 8,000 tokens (no real checkpoint's tokenizer offline).
    python benchmarks/maintainers/s38c/tok_bench.py"""
import time, random, statistics, string
from tokenizers import Tokenizer, models, trainers, pre_tokenizers
rng = random.Random(0)
words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
corpus = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(3000)]
tok = Tokenizer(models.BPE(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=8000, special_tokens=["[UNK]"]))
texts = []
for q in range(32):
    texts.append("Question: " + " ".join(rng.choice(words) for _ in range(12)) + "\n")
    texts += ["Answer: " + rng.choice(words) for _ in range(4)]
def med(fn, n=200):
    for _ in range(10): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append((time.perf_counter()-t)*1e6)
    return statistics.median(ts)
one = lambda: [tok.encode(t, add_special_tokens=False).ids for t in texts]
batch = lambda: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
assert one() == batch()
print("per-string encode us", round(med(one)), "encode_batch us", round(med(batch)), "strings", len(texts))
