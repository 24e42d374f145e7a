#!/usr/bin/python3
"""../shared/peers/torch_fmnist.py with the flags of ../shared/peers/torch_gpt.py: the same model,
optimizer, data, tuning (peer_env) and JSON line, plus --compile and --precision, so that the
Fashion-MNIST rows can run PyTorch at its best among eager and torch.compile, f32 and bf16.

usage: bench/torch_fmnist_peer.py {mlp|cnn} EPOCHS BATCH THREADS [--precision f32|bf16] [--compile]
                                  [--skip N] [--steps N]
  --precision bf16: torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss, f32
             weights, gradients and SGD (as torch_gpt.py's --precision bf16 on the CPU)
  --compile: torch.compile(model) (PyTorch 2 only); the test accuracy is computed by the model
             itself (no second compilation for the test set's shape)
  --skip N:  the first N training steps are run but not timed (torch.compile compiles in the first
             step); default 0
  --steps N: stop after N training steps (0, the default: EPOCHS whole epochs)
Timing: the training step alone (forward, loss, backward, SGD step), summed over the timed steps,
as torch_gpt.py and hpm's trainer time it (torch_fmnist.py times the whole epoch including the
batch gather, a few percent slower); train_samples_per_s counts the timed steps' samples only.
"""
import argparse, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "peers"))
import peer_env  # noqa: E402  PyTorch at its best here: see peer_env.py


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("model", choices=["mlp", "cnn"])
    p.add_argument("epochs", type=int)
    p.add_argument("batch", type=int)
    p.add_argument("threads", type=int)
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--skip", type=int, default=0)
    p.add_argument("--steps", type=int, default=0)
    a = p.parse_args(argv)
    if a.steps and a.skip >= a.steps:
        p.error("--skip must be below --steps")
    return a


a = parse()
peer_env.tune(a.threads)  # before torch loads: OpenBLAS reads its thread count then
import gzip, json, time, numpy as np, torch, torch.nn as nn, torch.nn.functional as F  # noqa: E402

D = "/usr/share/datasets/fashion-mnist/"


def load(kind):
    with gzip.open(D + f"{kind}-images-idx3-ubyte.gz") as f: x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(D + f"{kind}-labels-idx1-ubyte.gz") as f: y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.tensor(x, dtype=torch.float32) / 255.0, torch.tensor(y, dtype=torch.long)


torch.set_num_threads(peer_env.torch_threads(a.threads)); torch.manual_seed(0)
xtr, ytr = load("train"); xte, yte = load("t10k")
if a.model == "mlp":
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
else:
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
if a.compile and not hasattr(torch, "compile"):
    sys.exit(f"torch_fmnist_peer: --compile needs PyTorch 2 (this is {torch.__version__})")
net = torch.compile(model) if a.compile else model


def forward(m, x):
    if a.precision == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return m(x)
    return m(x)


def step_loss(xb, yb):
    if a.precision == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.cross_entropy(net(xb), yb)
    return F.cross_entropy(net(xb), yb)


n = xtr.shape[0]; train_s, seen, step = 0.0, 0, 0
for ep in range(a.epochs):
    perm = torch.randperm(n)
    for i in range(0, n - a.batch + 1, a.batch):
        if a.steps and step >= a.steps: break
        idx = perm[i:i + a.batch]; xb, yb = xtr[idx], ytr[idx]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True); loss = step_loss(xb, yb); loss.backward(); opt.step()
        if step >= a.skip:
            train_s += time.perf_counter() - t0; seen += a.batch
        step += 1
with torch.no_grad(): acc = (forward(model, xte).argmax(1) == yte).float().mean().item()
print(json.dumps({"openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "default"), "peer": "pytorch-" + torch.__version__,
                  "model": a.model, "threads": a.threads, "batch": a.batch, "epochs": a.epochs, "precision": a.precision,
                  "compile": a.compile, "steps": step, "timed_steps": step - min(a.skip, step),
                  "train_samples_per_s": round(seen / train_s, 1) if train_s > 0 else 0.0, "test_acc": round(acc, 4)}))
