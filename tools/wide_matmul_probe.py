"""One 70B layer's 4-bit projections by rows: the quantized kernel against dequantize + matmul.

Usage: PYTHONPATH=. python3 tools/wide_matmul_probe.py [--shape 70b] [--rows 1,8,16,...]

A packed batched round verifies every request's rows as one matrix, so a round
of 8 requests x 16 tokens runs the target's projections on 128 rows. Run 10
measured 227 ms for that forward against 82 ms for 16 rows. This times one
layer's projections (q/k/v and gate/up fused as the engine fuses them, o and
down) three ways, per layer, in ms:

- ``qmm``: ``mx.quantized_matmul`` on the 4-bit weights (what the engine runs);
- ``deq``: ``mx.dequantize`` the weights, then an ordinary matmul;
- ``dense``: the matmul alone on weights dequantized beforehand (the floor).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import mlx.core as mx

SHAPES = {  # hidden, q/k/v out, intermediate
    "70b": (8192, 8192 + 2 * 1024, 28672),
    "8b": (4096, 4096 + 2 * 1024, 14336),
    "tiny": (256, 256 + 2 * 64, 512),
}


def _weights(out: int, inp: int, dtype: mx.Dtype) -> tuple[mx.array, ...]:
    w = (mx.random.normal((out, inp)) * 0.02).astype(dtype)
    q = mx.quantize(w, group_size=64, bits=4)
    mx.eval(q)
    return tuple(q)


def _dequantized(q: tuple[mx.array, ...]) -> mx.array:
    w, scales, biases = q
    return mx.dequantize(w, scales, biases, group_size=64, bits=4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="70b", choices=sorted(SHAPES))
    ap.add_argument("--rows", default="1,8,16,32,48,64,96,128,192,256")
    ap.add_argument("--reps", type=int, default=8, help="layers chained per timing")
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    dtype = getattr(mx, a.dtype)
    hidden, qkv, inter = SHAPES[a.shape]
    projs = [  # (name, out, in)
        ("qkv", qkv, hidden),
        ("o", hidden, hidden),
        ("gate_up", 2 * inter, hidden),
        ("down", hidden, inter),
    ]
    weights = {n: _weights(o, i, dtype) for n, o, i in projs}
    dense = {n: _dequantized(weights[n]) for n, _, _ in projs}
    mx.eval(dense)

    def qmm(x: mx.array, n: str) -> mx.array:
        w, s, b = weights[n]
        return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)

    def deq(x: mx.array, n: str) -> mx.array:
        return x @ _dequantized(weights[n]).T

    def dns(x: mx.array, n: str) -> mx.array:
        return x @ dense[n].T

    ways = {"qmm": qmm, "deq": deq, "dense": dns}
    head = f"{a.shape} layer projections, {a.dtype}, ms per layer"
    print(f"{head} (median of 5, {a.reps} layers chained)")
    print("rows  " + "  ".join(f"{w:>7}" for w in ways) + "   deq/qmm")
    for m in [int(r) for r in a.rows.split(",")]:
        xs = (mx.random.normal((1, m, hidden)) * 0.1).astype(dtype)
        hs = (mx.random.normal((1, m, inter)) * 0.1).astype(dtype)
        mx.eval(xs, hs)
        row = {name: _per_layer(f, xs, hs, a.reps) for name, f in ways.items()}
        ratio = row["deq"] / row["qmm"]
        print(f"{m:>4}  " + "  ".join(f"{row[w]:7.2f}" for w in ways) + f"   {ratio:6.2f}")


def _per_layer(
    f: Callable[[mx.array, str], mx.array], xs: mx.array, hs: mx.array, reps: int
) -> float:
    """ms per layer of ``reps`` layers' projections chained, median of five."""
    inter = hs.shape[-1]

    def layer_chain() -> list[mx.array]:
        x, h, outs = xs, hs, []
        for _ in range(reps):  # chained, so no layer can be skipped or merged
            outs.append(f(x, "qkv"))
            g = f(x, "gate_up")
            x = f(x, "o") + f(h, "down")
            h = g[..., :inter]
        return [*outs, x]

    mx.eval(layer_chain())  # builds the kernels
    times = []
    for _ in range(5):
        t = time.perf_counter()
        mx.eval(layer_chain())
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times) / reps


if __name__ == "__main__":
    main()
