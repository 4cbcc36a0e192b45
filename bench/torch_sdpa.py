"""Time `torch.nn.functional.scaled_dot_product_attention` on one thread, as bench/attention_speed.py's peer.

Needs only torch, NumPy and bench/lib/ (which imports the standard library and NumPy), so it can
run under another Python than the project's (torch's CPU wheel here exists for Python 3.11 only),
from the repository root:

    python -m bench.torch_sdpa 1,2048,8,64,8 --causal --reps 3 --dtype float32 --clock cpu

Prints one JSON object: median forward and forward+backward milliseconds (gradients w.r.t.
q, k, v of sum(out * cotangent), as in bench/attention_speed.py) and torch's version. Inputs are
standard normal, laid out [B, H, N, D] as torch expects; timing does not depend on the values.
"""

import argparse
import json

import numpy as np
import torch

from bench.lib import CLOCKS, median_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", help="B,N,H,Dk,G (G: key/value heads)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    args = parser.parse_args()
    B, N, H, D, G = (int(x) for x in args.shape.split(","))
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    rng = np.random.default_rng(0)
    make = lambda heads: torch.from_numpy(rng.standard_normal((B, heads, N, D), np.float32)).to(dtype)
    q, k, v, cotangent = make(H), make(G), make(G), make(H)
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=args.causal, enable_gqa=G != H
    )

    def forward():
        with torch.no_grad():
            sdpa(q, k, v)

    def forward_backward():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        torch.autograd.grad((sdpa(*leaves) * cotangent).sum(), leaves)

    print(
        json.dumps(
            {
                "forward_ms": median_ms(forward, args.reps, clock=args.clock),
                "forward_backward_ms": median_ms(forward_backward, args.reps, clock=args.clock),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
