"""Session 33's A/B (kept in git at one commit, then removed: benchmarks/README.md): a cold image's Session.prepare with this tree's content key and unfilter
kernel against the ones before (M45's single sha256, the wavefront without the load ahead at 16 warps),
interleaved, two rounds, on one lease.  PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s33/prepare_ab.py  (from the repository root)"""
import hashlib, importlib.util, sys
import numpy as np
sys.path.insert(0, "benchmarks/maintainers")
import prepare_cost
from dohnuts.runtime import images
import dohnuts.ops._unfilter_kernel as kern

spec = importlib.util.spec_from_file_location("old_unfilter_kernel", "benchmarks/maintainers/s33/old_unfilter_kernel.py")
old_kern = importlib.util.module_from_spec(spec); spec.loader.exec_module(old_kern)
new_key, new_unfilter = images.content_key, kern.unfilter_triton


def old_key(rgb, vision):
    pixels = np.ascontiguousarray(np.asarray(rgb))
    h, w = pixels.shape[:2]
    header = (f"{images.PREPROCESS_POLICY}|patch={vision.patch_size}|temporal={vision.temporal_patch_size}"
              f"|merge={vision.spatial_merge_size}|channels={vision.in_channels}|{w}x{h}|").encode()
    d = hashlib.sha256(header); d.update(memoryview(pixels).cast("B")); return d.hexdigest()


variants = {"new key + new kernel": (new_key, new_unfilter), "old key + new kernel": (old_key, new_unfilter),
            "new key + old kernel": (new_key, old_kern.unfilter_triton), "old key + old kernel (M45)": (old_key, old_kern.unfilter_triton)}
for rnd in range(2):
    for name, (key, unf) in variants.items():
        images.content_key, kern.unfilter_triton = key, unf
        print(f"round {rnd} | {name}", flush=True)
        prepare_cost.main(["--workload", "workloads/gpu/image-cache-cold-2b.yaml", "--calls", "100"])
