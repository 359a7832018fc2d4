"""GPU check of the triton backend against the torch reference (run on a CUDA machine, no TRITON_INTERPRET).
Exactness on larger shapes than the interpreter allows (the GPU-shaped sampling kernels, split over positions and
vocab chunks, and the previous one-program-per-row kernels kept in sampling/triton_rowwise.py), the in-place race
check (big T, small shifts), PTX checks (div.rn without ftz, vectorised moves) and timings of both sampling
shapes side by side."""
import glob, os, tempfile
CACHE = os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton_cache_"))
import torch
import specdec_kernels as sk
from specdec_kernels import reference as ref
from specdec_kernels.moves import triton_kernels as tkm
from specdec_kernels.sampling import triton_kernels as tks, triton_rowwise as trow

dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
fails = 0

def check(ok, what):
    global fails
    if not ok:
        fails += 1
        print("FAIL", what)

def bits_equal(a, b):
    if a.dtype.is_floating_point:
        na, nb = a.isnan(), b.isnan()
        return torch.equal(na, nb) and torch.equal(a.masked_fill(na, 0), b.masked_fill(nb, 0))
    return torch.equal(a, b)

# sampling: big vocabularies, all dtypes, ragged drafts, denormal probabilities
for B, K, V in [(1, 0, 50257), (8, 4, 151936), (64, 8, 32000), (3, 1, 111)]:
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        lg = torch.randn(B, K + 1, V, device=dev, generator=g).to(dt)
        lg[..., ::97] = lg.amax(-1, keepdim=True)  # ties
        d = lg[:, :K].float().argmax(-1)
        nd = torch.randint(0, K + 1, (B,), device=dev, generator=g)
        want = ref.verify_greedy(d, lg, nd)
        for name, mod in (("split", tks), ("rowwise", trow)):
            check(all(torch.equal(x, y) for x, y in zip(mod.verify_greedy(d, lg, nd), want)),
                  ("verify", name, B, K, V, dt))
        p = torch.softmax(torch.randn(B, K + 1, V, device=dev, generator=g) * 3, -1)
        p[..., 1::5] *= 1e-38  # float32 denormals: a flush-to-zero kernel would differ
        p = p.to(dt)
        q = torch.softmax(torch.randn(B, K, V, device=dev, generator=g) * 3, -1).to(dt)
        d = torch.multinomial(q.float().reshape(-1, V), 1).reshape(B, K) if K else torch.zeros(B, 0, dtype=torch.long, device=dev)
        u, e = sk.draw_noise(B, K, V, torch.device(dev), g)
        for qq in (q, None):
            want = ref.rejection_sample(d, qq, p, nd, uniform=u, exponential=e)
            for name, mod in (("split", tks), ("rowwise", trow)):
                check(all(torch.equal(x, y) for x, y in zip(mod.rejection_sample(d, qq, p, nd, u, e), want)),
                      ("rejection", name, B, K, V, dt, qq is None))

# moves: KV caches as views, small shifts over long rows (the overlap race), all dtypes, compaction
for dt in (torch.bfloat16, torch.float32, torch.int64, torch.bool, torch.float16, torch.int32, torch.float64):
    for B, H, T, D in [(8, 8, 4096, 128), (3, 2, 1000, 64), (16, 4, 257, 80)]:
        buf = (torch.randn(B, H, T + 16, D, device=dev, generator=g) * 100).to(dt)
        xs = [buf[:, :, 8:T + 8], buf[:, :, :T].clone()]
        ys = [x.clone() for x in xs]
        s = torch.randint(-3, 4, (B,), device=dev, generator=g)
        tkm.shift_rows_(xs, s, dim=-2, fill=0); ref.shift_rows_(ys, s, dim=-2, fill=0)
        check(all(bits_equal(a, b) for a, b in zip(xs, ys)), ("shift", dt, B, H, T, D))
        keep = torch.rand(B, T, device=dev, generator=g) < 0.9
        tkm.compact_rows_(xs, keep, dim=-2, fill=1); ref.compact_rows_(ys, keep, dim=-2, fill=1)
        check(all(bits_equal(a, b) for a, b in zip(xs, ys)), ("compact", dt, B, H, T, D))

# PTX (from the fresh cache dir set above): precise division without ftz, 16-byte vector moves with a barrier
for path in glob.glob(os.path.join(CACHE, "**", "*.ptx"), recursive=True):
    ptx = open(path).read()
    if any(k in ptx for k in ("_rejection_sweep_kernel", "_verify_sweep_kernel", "_rejection_sample_kernel",
                              "_verify_greedy_kernel")):
        print(os.path.basename(path), "div.rn.f32:", "div.rn.f32" in ptx, "ftz:", ".ftz" in ptx)
    if "_move_rows_kernel" in ptx:
        print(os.path.basename(path), "v4 loads:", "ld.global.v4" in ptx, "v4 stores:", "st.global.v4" in ptx,
              "barrier:", "bar.sync" in ptx or "barrier.sync" in ptx)

# timings (CUDA events), after warm-up
def bench(f, n=50):
    f(); torch.cuda.synchronize()
    s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): f()
    t.record(); torch.cuda.synchronize()
    return s.elapsed_time(t) / n * 1e3
kv = [torch.randn(8, 8, 2048, 128, device=dev).to(torch.bfloat16) for _ in range(64)]
sh = torch.randint(0, 5, (8,), device=dev)
print("shift 64x[8,8,2048,128] bf16: triton %.1f us, torch %.1f us" % (
    bench(lambda: tkm.shift_rows_(kv, sh, dim=-2, fill=0)), bench(lambda: ref.shift_rows_(kv, sh, dim=-2, fill=0))))
# The two shapes of the sampling kernels: split over (rows x positions x vocab chunks) against one program per row.
for B, K, V in [(1, 4, 32000), (8, 4, 32000), (8, 4, 151936), (64, 8, 32000)]:
    lg = torch.randn(B, K + 1, V, device=dev, dtype=torch.bfloat16); d = lg[:, :K].argmax(-1)
    print("verify_greedy B%d K%d V%d bf16: split %.1f us, rowwise %.1f us, torch %.1f us" % (
        B, K, V, bench(lambda: tks.verify_greedy(d, lg, None)), bench(lambda: trow.verify_greedy(d, lg, None)),
        bench(lambda: ref.verify_greedy(d, lg, None))))
    p = torch.softmax(torch.randn(B, K + 1, V, device=dev), -1); q = torch.softmax(torch.randn(B, K, V, device=dev), -1)
    u, e = sk.draw_noise(B, K, V, torch.device(dev), g)
    print("rejection_sample B%d K%d V%d f32: split %.1f us, rowwise %.1f us, torch %.1f us" % (
        B, K, V, bench(lambda: tks.rejection_sample(d, q, p, None, u, e)),
        bench(lambda: trow.rejection_sample(d, q, p, None, u, e)),
        bench(lambda: ref.rejection_sample(d, q, p, None, uniform=u, exponential=e))))
print("FAILS", fails)
raise SystemExit(1 if fails else 0)
