"""Generate the PyTorch golden fixtures that hpm's C++ tests compare against.

Every case is written as one small safetensors file in tests/golden/fixtures/ (see README.md for
the format and the tensor naming convention). The C++ tests only read the committed files; Python
is needed only to regenerate them:

    /usr/bin/python3 tests/golden/generate.py

Needs only torch (Debian's python3-torch 1.13, with libopenblas0-pthread) and numpy, which
scripts/setup_peers.sh installs (it is run first if torch is missing); the safetensors writer and reader are
below. All math runs in float32 on the CPU, seeded per case, so re-running gives byte-identical
files. After writing, every file is read back with the reader here and compared to the tensors
that were written.
"""

import json
import math
import os
import struct
import sys
import zlib

try:
    import torch
except ImportError:
    import subprocess
    subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                                 "setup_peers.sh")], check=True)
    import torch
import numpy as np
import torch.nn as nn
import torch.nn.functional as F

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

# safetensors dtype name <-> (torch dtype, little-endian numpy dtype)
DTYPES = {
    "F32": (torch.float32, np.dtype("<f4")),
    "I64": (torch.int64, np.dtype("<i8")),
}


# ---------------------------------------------------------------------------------------------
# safetensors writer / reader


def encode_safetensors(tensors, config):
    """tensors: list of (name, tensor); config: dict stored as JSON in __metadata__["config"]."""
    header = {"__metadata__": {"config": json.dumps(config)}}
    blobs, offset = [], 0
    for name, t in tensors:
        t = t.detach().cpu().contiguous()
        st_name = next(k for k, (td, _) in DTYPES.items() if td == t.dtype)
        blob = t.numpy().astype(DTYPES[st_name][1]).tobytes()
        header[name] = {"dtype": st_name, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)  # so the data section starts 8-aligned
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def decode_safetensors(data):
    """Returns (config dict, list of (name, tensor)) in data-offset order."""
    (n,) = struct.unpack("<Q", data[:8])
    assert (8 + n) % 8 == 0, "header not padded to 8 bytes"
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    config = json.loads(header.pop("__metadata__")["config"])
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    out, covered = [], 0
    for name, e in entries:
        begin, end = e["data_offsets"]
        assert begin == covered, f"{name}: gap or overlap at {begin}"
        torch_dtype, np_dtype = DTYPES[e["dtype"]]
        arr = np.frombuffer(body[begin:end], dtype=np_dtype).reshape(e["shape"])
        out.append((name, torch.from_numpy(arr.copy()).to(torch_dtype)))
        covered = end
    assert covered == len(body), "trailing bytes in data section"
    return config, out


# ---------------------------------------------------------------------------------------------
# helpers


def randomize(module):
    """Replace the default init with randn * 0.5 so tests notice any mix-up between parameters."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)


def layer_case(config, module, inputs, train=True, prepare=None, exact=False):
    """Forward + backward of `module` on `inputs` (list of tensors) with a random upstream grad.

    `prepare(module)` may set buffers before the forward (they are recorded as buffer_before.*).
    Integer inputs get no grad. exact: the values are drawn in float32 (what hpm loads) but the
    arithmetic runs in float64, and the results are rounded to float32 at the end: the true values
    of a float32 model, for composite models whose float32 rounding (PyTorch's as much as hpm's)
    exceeds an element-wise 1e-5 (see README.md).
    """
    randomize(module)
    if prepare is not None:
        prepare(module)
    module.train(train)
    if exact:
        config = {**config, "exact": True}
        module.double()
        inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    inputs = [x.requires_grad_(x.is_floating_point()) for x in inputs]
    tensors = [("input" if i == 0 else f"input{i + 1}", x) for i, x in enumerate(inputs)]
    tensors += [(f"param.{n}", p) for n, p in module.named_parameters()]
    tensors += [(f"buffer_before.{n}", b.clone()) for n, b in module.named_buffers()]

    out = module(*inputs)
    grad_output = torch.randn_like(out)
    (out * grad_output).sum().backward()

    tensors += [("output", out), ("grad_output", grad_output)]
    tensors += [("grad.input" if i == 0 else f"grad.input{i + 1}", x.grad)
                for i, x in enumerate(inputs) if x.grad is not None]
    tensors += [(f"grad.param.{n}", p.grad) for n, p in module.named_parameters()]
    tensors += [(f"buffer.{n}", b.clone()) for n, b in module.named_buffers()]
    if exact:
        tensors = [(n, t.detach().float() if t.is_floating_point() else t) for n, t in tensors]
    return config, tensors


class Fn(nn.Module):
    """Wraps a parameter-free function as a module."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def distinct(*shape):
    """Random values with no two equal (shuffled multiples of 0.25 around 0), so pooling has no ties."""
    n = int(np.prod(shape))
    return ((torch.randperm(n).float() - n / 2) * 0.25).reshape(shape)


# ---------------------------------------------------------------------------------------------
# layers


def layer_cases():
    def conv(name, n, c, hw, out, k, stride, pad, bias):
        cfg = {"kind": "conv2d", "in_channels": c, "out_channels": out, "kernel_size": k,
               "stride": stride, "padding": pad, "bias": bias}
        return name, lambda: layer_case(cfg, nn.Conv2d(c, out, k, stride, pad, bias=bias),
                                        [torch.randn(n, c, hw, hw)])

    def pool(name, kind, module, shape, **cfg):
        return name, lambda: layer_case({"kind": kind, **cfg}, module, [distinct(*shape)])

    def act(name, kind, fn, shape=(3, 5), **cfg):
        return name, lambda: layer_case({"kind": kind, **cfg}, Fn(fn), [torch.randn(*shape)])

    def bn_eval_stats(m):
        with torch.no_grad():
            m.running_mean.copy_(torch.randn_like(m.running_mean) * 0.5)
            m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)

    return [
        ("linear", lambda: layer_case({"kind": "linear", "in_features": 5, "out_features": 3,
                                       "bias": True}, nn.Linear(5, 3), [torch.randn(4, 5)])),
        ("linear_nobias", lambda: layer_case({"kind": "linear", "in_features": 5,
                                              "out_features": 3, "bias": False},
                                             nn.Linear(5, 3, bias=False), [torch.randn(4, 5)])),
        conv("conv2d", 2, 3, 7, 4, 3, 1, 1, True),
        conv("conv2d_stride2", 2, 3, 8, 4, 3, 2, 1, True),
        conv("conv2d_nobias", 2, 3, 7, 4, 5, 1, 2, False),
        conv("conv2d_1x1", 2, 3, 5, 4, 1, 1, 0, True),
        pool("maxpool2d", "maxpool2d", nn.MaxPool2d(2, 2), (2, 3, 6, 6),
             kernel_size=2, stride=2, padding=0),
        pool("maxpool2d_k3s2p1", "maxpool2d", nn.MaxPool2d(3, 2, 1), (2, 2, 7, 7),
             kernel_size=3, stride=2, padding=1),
        pool("avgpool2d", "avgpool2d", nn.AvgPool2d(2, 2), (2, 3, 6, 6),
             kernel_size=2, stride=2, padding=0, count_include_pad=True),
        pool("avgpool2d_k3s1p1", "avgpool2d", nn.AvgPool2d(3, 1, 1, count_include_pad=True),
             (2, 2, 5, 5), kernel_size=3, stride=1, padding=1, count_include_pad=True),
        act("global_avgpool", "global_avgpool",
            lambda x: torch.flatten(F.adaptive_avg_pool2d(x, 1), 1), shape=(2, 3, 4, 4)),
        ("flatten", lambda: layer_case({"kind": "flatten", "start_dim": 1, "end_dim": -1},
                                       nn.Flatten(), [torch.randn(2, 3, 2, 2)])),
        act("relu", "relu", F.relu),
        act("gelu", "gelu", lambda x: F.gelu(x, approximate="none"), approximate="none"),
        act("gelu_tanh", "gelu", lambda x: F.gelu(x, approximate="tanh"), approximate="tanh"),
        act("tanh", "tanh", torch.tanh),
        act("sigmoid", "sigmoid", torch.sigmoid),
        ("batchnorm1d", lambda: layer_case(
            {"kind": "batchnorm1d", "num_features": 4, "eps": 1e-5, "momentum": 0.1,
             "affine": True, "training": True}, nn.BatchNorm1d(4), [torch.randn(6, 4)])),
        ("batchnorm2d", lambda: layer_case(
            {"kind": "batchnorm2d", "num_features": 4, "eps": 1e-5, "momentum": 0.1,
             "affine": True, "training": True}, nn.BatchNorm2d(4), [torch.randn(3, 4, 3, 3)])),
        ("batchnorm2d_eval", lambda: layer_case(
            {"kind": "batchnorm2d", "num_features": 4, "eps": 1e-5, "momentum": 0.1,
             "affine": True, "training": False}, nn.BatchNorm2d(4), [torch.randn(3, 4, 3, 3)],
            train=False, prepare=bn_eval_stats)),
        ("layernorm", lambda: layer_case(
            {"kind": "layernorm", "normalized_shape": [6], "eps": 1e-5,
             "elementwise_affine": True}, nn.LayerNorm(6), [torch.randn(4, 6)])),
        ("layernorm_2d", lambda: layer_case(
            {"kind": "layernorm", "normalized_shape": [3, 4], "eps": 1e-5,
             "elementwise_affine": True}, nn.LayerNorm([3, 4]), [torch.randn(2, 3, 4)])),
        ("embedding", lambda: layer_case(
            {"kind": "embedding", "num_embeddings": 10, "embedding_dim": 4},
            nn.Embedding(10, 4), [torch.randint(0, 10, (2, 3))])),
        ("dropout_eval", lambda: layer_case({"kind": "dropout", "p": 0.5, "training": False},
                                            nn.Dropout(0.5), [torch.randn(3, 5)], train=False)),
        act("softmax", "softmax", lambda x: F.softmax(x, dim=-1), dim=-1),
        act("log_softmax", "log_softmax", lambda x: F.log_softmax(x, dim=-1), dim=-1),
    ]


# ---------------------------------------------------------------------------------------------
# ops of the models that are not stacks (attention, GPT): tensors in, one tensor out


def attention_reference(q, k, v, causal):
    """softmax(q k^T / sqrt(D), causal mask) v, written out: torch 1.13 has no fused SDPA."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        t, n = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(t, n, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def op_cases():
    def op(name, kind, fn, shapes, **cfg):
        return name, lambda: layer_case({"kind": kind, **cfg}, Fn(fn),
                                        [torch.randn(*s) for s in shapes], exact=True)

    # T = 70 is not a multiple of hpm's 64-row tiles; 3 heads of 16.
    qkv = [(2, 3, 70, 16)] * 3
    return [
        op("attention", "attention", lambda q, k, v: attention_reference(q, k, v, False), qkv,
           causal=False),
        op("attention_causal", "attention", lambda q, k, v: attention_reference(q, k, v, True),
           qkv, causal=True),
        op("batched_matmul", "matmul", lambda a, b: a @ b, [(2, 1, 5, 4), (3, 4, 6)]),
    ]


# ---------------------------------------------------------------------------------------------
# GPT: ../shared/peers/torch_gpt.py's model itself, so that hpm's GPT is held to exactly it


def torch_gpt():
    peers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared",
                         "peers")
    sys.path.insert(0, peers)
    import torch_gpt as tg  # noqa: E402 (the peer; its import checks for the pthread OpenBLAS)
    return tg


def gpt_block_case():
    tg = torch_gpt()
    e, h = 32, 4
    return layer_case({"kind": "gpt_block", "n_embd": e, "n_head": h, "bias": True},
                      tg.Block(e, h), [torch.randn(2, 10, e)], exact=True)


def gpt_logits(m, idx):
    x = m.tok(idx) + m.pos(torch.arange(idx.shape[1]))
    for b in m.blocks:
        x = b(x)
    return m.head(m.ln(x))


def gpt_case(steps=10):
    """torch_gpt.py's default model (4 layers, 4 heads, 128 wide, block 64, vocab 256, tied head)
    with its own init: logits and loss of one batch, every parameter's gradient, then `steps`
    training steps on that batch as torch_gpt.py takes them (AdamW betas 0.9/0.99, eps 1e-8,
    weight decay 0.1 on 2-D parameters only, gradients clipped to norm 1.0; lr 1e-3 constant)."""
    tg = torch_gpt()
    cfg = {"kind": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64,
           "vocab_size": 256, "bias": True, "tie_weights": True, "lr": 1e-3, "betas": [0.9, 0.99],
           "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0, "steps": steps}
    m = tg.GPT(4, 4, 128, 64)
    idx, tgt = torch.randint(0, 256, (2, 64)), torch.randint(0, 256, (2, 64))
    tensors = [("input", idx), ("target", tgt)]
    tensors += [(f"param.{n}", p.detach().clone()) for n, p in m.named_parameters()]
    m.double()  # float32 values, float64 arithmetic: the true results (see layer_case's exact)
    logits = gpt_logits(m, idx)
    loss = F.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1))
    loss.backward()
    tensors += [("logits", logits.detach()), ("loss", loss.detach())]
    tensors += [(f"grad.param.{n}", p.grad.clone()) for n, p in m.named_parameters()]

    decay = [p for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        step_loss = m(idx, tgt)
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        losses.append(step_loss.item())
    tensors += [("losses", torch.tensor(losses))]
    tensors += [(f"step{steps}.{n}", p.detach().clone()) for n, p in m.named_parameters()]
    result = [(n, t.detach().float() if t.is_floating_point() else t) for n, t in tensors]
    float32_drift(tg, dict(result), idx, tgt, steps)
    return cfg, result


def float32_drift(tg, exact, idx, tgt, steps):
    """Prints how far PyTorch's own float32 run of gpt_case ends from the exact parameters: the
    yardstick for the tolerance golden_test.cpp holds hpm's float32 run to."""
    torch.manual_seed(zlib.crc32(b"gpt"))  # the case's seed: the same initial weights
    m = tg.GPT(4, 4, 128, 64)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": [p for p in m.parameters() if p.dim() < 2],
                              "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        m(idx, tgt).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    norm, elem = 0.0, 0.0
    for n, p in m.named_parameters():
        a, e = p.detach().double(), exact[f"step{steps}.{n}"].double()
        if "qkv.bias" in n:  # the key third is rounding noise (golden_test.cpp says why)
            e128 = e.shape[0] // 3
            a, e = torch.cat([a[:e128], a[2 * e128:]]), torch.cat([e[:e128], e[2 * e128:]])
        norm = max(norm, ((a - e).norm() / e.norm()).item())
        elem = max(elem, ((a - e).abs() / (e.abs() + e.abs().max())).max().item())
    print(f"gpt: PyTorch float32 after {steps} steps, from the exact parameters: "
          f"normwise {norm:.2e}, element-wise {elem:.2e}")


class BasicBlock(nn.Module):
    """ResNet's BasicBlock with torchvision's names (torchvision is not a dependency here)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.downsample is None else self.downsample(x)))


def resnet_block_cases():
    def case(cin, cout, stride):
        return lambda: layer_case({"kind": "resnet_basic_block", "in": cin, "out": cout,
                                   "stride": stride}, BasicBlock(cin, cout, stride),
                                  [torch.randn(2, cin, 6, 6)], exact=True)
    return [("resnet_block", case(8, 8, 1)), ("resnet_block_downsample", case(8, 16, 2))]


# ---------------------------------------------------------------------------------------------
# losses


def loss_case(config, loss_fn, x, extra):
    """Scalar loss of `x` (and the fixed tensors in `extra`), with d loss / d x."""
    x.requires_grad_(True)
    loss = loss_fn(x)
    loss.backward()
    return config, [("input", x)] + extra + [("output", loss), ("grad.input", x.grad)]


def kd_term(s, t, temperature):
    """T^2 * KL(softmax(t/T) || softmax(s/T)), batch mean: the distillation loss."""
    return temperature * temperature * F.kl_div(F.log_softmax(s / temperature, dim=-1),
                                                F.softmax(t / temperature, dim=-1),
                                                reduction="batchmean")


def loss_cases():
    def cross_entropy_lm():
        # A language model's loss: (B, T, V) logits against (B, T) next tokens, some ignored.
        x, y = torch.randn(2, 7, 11), torch.randint(0, 11, (2, 7))
        y[0, 3] = y[1, 0] = -100
        return loss_case({"kind": "cross_entropy", "reduction": "mean", "ignore_index": -100},
                         lambda x: F.cross_entropy(x.reshape(-1, 11), y.reshape(-1)), x,
                         [("target", y)])

    def cross_entropy(smoothing):
        def make():
            x, y = torch.randn(5, 7), torch.randint(0, 7, (5,))
            return loss_case({"kind": "cross_entropy", "reduction": "mean",
                              "label_smoothing": smoothing},
                             lambda x: F.cross_entropy(x, y, label_smoothing=smoothing),
                             x, [("target", y)])
        return make

    def nll():
        x, y = F.log_softmax(torch.randn(5, 7), dim=-1), torch.randint(0, 7, (5,))
        return loss_case({"kind": "nll", "reduction": "mean"}, lambda x: F.nll_loss(x, y),
                         x, [("target", y)])

    def mse():
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        return loss_case({"kind": "mse", "reduction": "mean"}, lambda x: F.mse_loss(x, y),
                         x, [("target", y)])

    def kl_div():
        x, p = torch.randn(5, 7), F.softmax(torch.randn(5, 7), dim=-1)
        return loss_case({"kind": "kl_div", "reduction": "batchmean", "input": "logits",
                          "target": "probabilities"},
                         lambda x: F.kl_div(F.log_softmax(x, dim=-1), p, reduction="batchmean"),
                         x, [("target", p)])

    def distill_kd():
        s, t, temp = torch.randn(5, 7), torch.randn(5, 7) * 2, 4.0
        return loss_case({"kind": "distill_kd", "temperature": temp, "reduction": "batchmean"},
                         lambda s: kd_term(s, t, temp), s, [("teacher", t)])

    def distill_combined():
        s, t, y = torch.randn(5, 7), torch.randn(5, 7) * 2, torch.randint(0, 7, (5,))
        alpha, temp = 0.3, 2.0
        return loss_case({"kind": "distill_combined", "alpha": alpha, "temperature": temp},
                         lambda s: (1 - alpha) * F.cross_entropy(s, y)
                         + alpha * kd_term(s, t, temp),
                         s, [("teacher", t), ("target", y)])

    return [
        ("cross_entropy", cross_entropy(0.0)),
        ("cross_entropy_lm", cross_entropy_lm),
        ("cross_entropy_smooth", cross_entropy(0.1)),
        ("nll", nll),
        ("mse", mse),
        ("kl_div", kl_div),
        ("distill_kd", distill_kd),
        ("distill_combined", distill_combined),
    ]


# ---------------------------------------------------------------------------------------------
# optimizers, schedules, clipping

SGD_KEYS = ["lr", "momentum", "dampening", "nesterov", "weight_decay"]
ADAM_KEYS = ["lr", "betas", "eps", "weight_decay", "amsgrad"]


def optimizer_case(kind, cls, keys, steps=10, **hyper):
    """`steps` optimizer steps on w [3,4] with grad = a * w + b recomputed from the current w."""
    w = torch.randn(3, 4)
    a = torch.rand(3, 4) + 0.5
    b = torch.randn(3, 4)
    init = w.clone()
    w = nn.Parameter(w)
    opt = cls([w], foreach=False, **hyper)
    config = {"kind": kind, "steps": steps}
    for k in keys:  # torch's names and values, numbers always as floats
        v = opt.defaults[k]
        config[k] = [float(x) for x in v] if isinstance(v, tuple) else \
            v if isinstance(v, bool) else float(v)
    tensors = [("init", init), ("a", a), ("b", b)]
    for i in range(1, steps + 1):
        with torch.no_grad():
            w.grad = a * w + b
        opt.step()
        tensors.append((f"step.{i}", w.detach().clone()))
    return config, tensors


def optimizer_cases():
    sgd = lambda **h: lambda: optimizer_case("sgd", torch.optim.SGD, SGD_KEYS, **h)
    adam = lambda **h: lambda: optimizer_case("adam", torch.optim.Adam, ADAM_KEYS, **h)
    return [
        ("sgd", sgd(lr=0.1)),
        ("sgd_momentum", sgd(lr=0.05, momentum=0.9)),
        ("sgd_nesterov", sgd(lr=0.05, momentum=0.9, nesterov=True)),
        ("sgd_weight_decay", sgd(lr=0.1, momentum=0.9, weight_decay=0.01, dampening=0.0)),
        ("adam", adam(lr=0.01)),
        ("adam_weight_decay", adam(lr=0.01, weight_decay=0.1)),
        ("adam_amsgrad", adam(lr=0.01, amsgrad=True, betas=(0.8, 0.95))),
        ("adamw", lambda: optimizer_case("adamw", torch.optim.AdamW, ADAM_KEYS,
                                         lr=0.01, weight_decay=0.1)),
    ]


def schedules_case(base_lr=0.1, steps=20):
    """Learning rate in use at steps 0..steps-1 for each scheduler."""
    params = {
        "step_lr": (torch.optim.lr_scheduler.StepLR, {"step_size": 5, "gamma": 0.5}),
        "cosine": (torch.optim.lr_scheduler.CosineAnnealingLR, {"T_max": 20, "eta_min": 0.001}),
        "warmup_linear": (torch.optim.lr_scheduler.LinearLR,
                          {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 5}),
    }
    config = {"kind": "schedules", "base_lr": base_lr, "steps": steps}
    tensors = []
    for name, (cls, kwargs) in params.items():
        opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=base_lr)
        sched = cls(opt, **kwargs)
        lrs = []
        for _ in range(steps):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        config[name] = kwargs
        tensors.append((name, torch.tensor(lrs, dtype=torch.float64).float()))
    return config, tensors


def clip_case(max_norm=1.0):
    grads = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2)]
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm, norm_type=2.0)
    assert total > max_norm, "gradients should actually be clipped"
    return ({"kind": "clip_grad_norm", "max_norm": max_norm, "norm_type": 2.0},
            [(f"grad.{i}", g) for i, g in enumerate(grads)]
            + [(f"clipped.{i}", p.grad) for i, p in enumerate(params)]
            + [("total_norm", total.reshape([]))])


# ---------------------------------------------------------------------------------------------


def main():
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)  # no thread-count-dependent reduction order
    cases = layer_cases() + op_cases() + [("gpt_block", gpt_block_case), ("gpt", gpt_case)] + \
        resnet_block_cases() + \
        loss_cases() + optimizer_cases() + [
        ("schedules", schedules_case), ("clip_grad_norm", clip_case)]
    os.makedirs(FIXTURES, exist_ok=True)
    total = 0
    for name, make in cases:
        torch.manual_seed(zlib.crc32(name.encode()))  # per-case seed, stable when cases are added
        config, tensors = make()
        names = [n for n, _ in tensors]
        assert len(set(names)) == len(names), f"{name}: duplicate tensor names"
        for n, t in tensors:
            assert t.dtype in (torch.float32, torch.int64), f"{name}/{n}: {t.dtype}"
            assert not t.is_floating_point() or torch.isfinite(t).all(), f"{name}/{n}: non-finite"
        data = encode_safetensors(tensors, config)
        path = os.path.join(FIXTURES, name + ".safetensors")
        with open(path, "wb") as f:
            f.write(data)
        total += len(data)

        # Read back and compare with what torch computed.
        with open(path, "rb") as f:
            config2, tensors2 = decode_safetensors(f.read())
        assert config2 == config and config2["kind"]
        assert [n for n, _ in tensors2] == names
        for (n, t), (_, t2) in zip(tensors, tensors2):
            assert t.dtype == t2.dtype and t.shape == t2.shape and torch.equal(t.detach(), t2), n
        print(f"{name + '.safetensors':32s} {len(data):6d} B  {' '.join(names)}")
    print(f"{len(cases)} files, {total} bytes in {FIXTURES}")


if __name__ == "__main__":
    sys.exit(main())
