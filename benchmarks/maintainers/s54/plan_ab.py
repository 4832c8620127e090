"""Session 54 (scratch): `plan_request` with one `encode_many` call a request against main's one
`encode` a string (the old module from git), interleaved round by round in one process, on
text-2b's request: the presets' byte tokenizer and a checkpoint-like `tokenizer.json` (a byte-level
BPE of 8,000 ids trained here on random words, as M51's tok_bench did).

    python benchmarks/maintainers/s54/plan_ab.py OLD_PLAN.py [ROUNDS]
"""
import importlib.util
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.model.build import resolve_source
from dohnuts.runtime import plan as new
from dohnuts.runtime.tokenizer import HFTokenizer, tokenizer_for

spec_ = importlib.util.spec_from_file_location("plan_old", sys.argv[1])
old = importlib.util.module_from_spec(spec_)
sys.modules["plan_old"] = old
spec_.loader.exec_module(old)
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 300

pm = plugin_manager()
kinds, targets = collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")
spec = load_workload("workloads/gpu/text-2b.yaml", kinds, targets, gpu=True)
cfg, ckpt = resolve_source(spec.model)
byte_tok = tokenizer_for(cfg, ckpt)
calls = kinds[spec.kind].calls(WorkloadContext(spec, byte_tok, cfg, Path(tempfile.mkdtemp()), random.Random(spec.seed)))
req = calls[0].request

rng = random.Random(0)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.add_special_tokens(["<|endoftext|>", "<|im_end|>"])
bpe.train_from_iterator([" ".join(rng.choice(words) for _ in range(50)) for _ in range(2000)],
                        trainers.BpeTrainer(vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
path = Path(tempfile.mkdtemp()) / "tokenizer.json"
bpe.save(str(path))
hf_tok = HFTokenizer(path, cfg)

for name, tok in (("bytes", byte_tok), ("tokenizer.json", hf_tok)):
    a = old.plan_request(req, tok, max_len=100_000)
    b = new.plan_request(req, tok, max_len=100_000)
    assert (a.sequences, a.score_positions, a.prefix_len, a.common_prefix_len) == (b.sequences, b.score_positions, b.prefix_len, b.common_prefix_len), name
    t = {"old": [], "new": []}
    for r in range(rounds):
        for which, mod in ((("old", old), ("new", new)) if r % 2 else (("new", new), ("old", old))):
            t0 = time.perf_counter()
            mod.plan_request(req, tok, max_len=100_000)
            t[which].append((time.perf_counter() - t0) * 1e3)
    tokens = sum(a.lengths)
    print(f"{name}: {len(req.questions)} questions, {tokens} tokens; plan_request median "
          f"old {statistics.median(t['old']):.3f} ms, new {statistics.median(t['new']):.3f} ms "
          f"(p10 {sorted(t['old'])[rounds // 10]:.3f} / {sorted(t['new'])[rounds // 10]:.3f})")
