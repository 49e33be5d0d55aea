"""The conv2d workload of `rdna1-kmgr vm-test --gpu ... --workload conv2d`: GPU results against the CPU's.

    python3 conv2d.py [--device cuda] [--sweep standard|matrix|smoke]

Conv2d forward and backward for kernel sizes 1, 3, 5, 7 and 11, and a ResNet-18 forward (defined here:
torch only, no torchvision), each run on DEVICE and on the CPU with the same seeded inputs and weights.
`--sweep matrix` is the experiment's: kernel sizes 1-11 at spatial sizes on both sides of 42x42 (where
GEMM convolutions hung on the seeds' board) up to 512x512, a few channel counts and batch sizes;
`--sweep smoke` is two small cases, for a CPU-against-CPU run in an emulated guest.
Prints one JSON object: {"device", "tolerance", "cases": [{case, max_abs_err, ok}], "ok"}; or, when it
cannot run, {"error": ...} and exit code 3. ROCm's torch names the GPU "cuda"; `--device cpu` compares the
CPU with itself, a smoke test of this script on a machine without a GPU.

Tolerance: |gpu - cpu| <= ATOL + RTOL * |cpu| elementwise, in float32 (TF32 off). A correct GPU differs
from the CPU only by rounding: other convolution algorithms (Winograd, FFT, implicit GEMM) sum the
C*k*k products in another order, which for these sizes moves results by ~1e-5 relative; 1e-3 leaves
room for that and for ResNet-18's 20 layers. What the quirks guard against (VRAM mapped with the wrong
memory type, stale or torn reads) corrupts whole lines of data, errors of order 1, far above it.
"""

import argparse
import json
import sys

RTOL = 1e-3
ATOL = 1e-3
KERNEL_SIZES = (1, 3, 5, 7, 11)
SEED = 1234


def _channels(hw: int) -> tuple:
    """(in, out, batch) for a spatial size: fewer channels as images grow, so a CPU reference stays seconds."""
    return (16, 32, 4) if hw <= 64 else (16, 16, 2) if hw <= 128 else (8, 8, 1) if hw <= 256 else (3, 8, 1)


# Conv2d shapes per sweep: (kernel size, height = width, in channels, out channels, batch).
SWEEPS = {
    "matrix": tuple((k, hw, *_channels(hw)) for k in (1, 3, 5, 7, 9, 11) for hw in (32, 42, 43, 64, 128, 256, 512))
    + ((3, 43, 3, 64, 8), (3, 43, 64, 64, 2), (3, 64, 128, 128, 1)),
    "smoke": ((1, 8, 2, 4, 1), (3, 43, 2, 4, 1)),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sweep", default="standard", choices=("standard", *SWEEPS))
    args = parser.parse_args(argv)
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - any import failure means "cannot run"
        return fail(f"cannot import torch: {err}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return fail(f"torch {torch.__version__} sees no GPU (torch.cuda.is_available() is False; "
                    f"HIP {getattr(torch.version, 'hip', None)})")
    # Exact float32 on both sides: TF32 would loosen the GPU's results by design.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    cases = []
    if args.sweep == "standard":
        for k in KERNEL_SIZES:
            cases += conv_cases(torch, device, k)
        cases.append(resnet_case(torch, device))
    else:
        for shape in SWEEPS[args.sweep]:
            cases += conv_cases(torch, device, *shape)
    print(json.dumps({"device": args.device, "torch": torch.__version__, "sweep": args.sweep,
                      "tolerance": {"rtol": RTOL, "atol": ATOL, "dtype": "float32"},
                      "cases": cases, "ok": all(c["ok"] for c in cases)}))
    return 0


def fail(why: str) -> int:
    print(json.dumps({"error": why}))
    return 3


def compare(torch, name: str, got, want) -> dict:
    got = got.detach().to("cpu")
    want = want.detach()
    diff = (got - want).abs()
    ok = bool(torch.isfinite(got).all()) and bool((diff <= ATOL + RTOL * want.abs()).all())
    return {"case": name, "max_abs_err": float(diff.max()), "ok": ok}


def conv_cases(torch, device, k: int, hw: int = 32, cin: int = 16, cout: int = 32, batch: int = 2) -> list:
    """Forward output, and the input and weight gradients of a sum of squares, on device and CPU."""
    gen = torch.Generator().manual_seed(SEED + k)
    conv = torch.nn.Conv2d(cin, cout, kernel_size=k, padding=k // 2, bias=True)
    with torch.no_grad():
        for param in conv.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    x = torch.randn(batch, cin, hw, hw, generator=gen)
    results = {}
    for where in ("cpu", device):
        layer = torch.nn.Conv2d(cin, cout, kernel_size=k, padding=k // 2).to(where)
        layer.load_state_dict(conv.state_dict())
        inp = x.clone().to(where).requires_grad_(True)
        out = layer(inp)
        (out * out).sum().backward()
        results[str(where)] = (out, inp.grad, layer.weight.grad)
    cpu, dev = results["cpu"], results[str(device)]
    # The standard sweep's shape keeps its short names (the verdict lists them).
    name = f"conv2d k={k}" if (hw, cin, cout, batch) == (32, 16, 32, 2) else f"conv2d k={k} {hw}x{hw} c{cin}->{cout} n{batch}"
    return [
        compare(torch, f"{name} forward", dev[0], cpu[0]),
        compare(torch, f"{name} backward input", dev[1], cpu[1]),
        compare(torch, f"{name} backward weight", dev[2], cpu[2]),
    ]


def resnet_case(torch, device) -> dict:
    torch.manual_seed(SEED)
    model = resnet18(torch).eval()  # eval: batch norm uses its (fixed) running statistics
    x = torch.randn(2, 3, 112, 112, generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        want = model(x)
        got = model.to(device)(x.to(device))
    return compare(torch, "resnet18 forward", got, want)


def resnet18(torch, classes: int = 1000):
    """ResNet-18 (He et al. 2015) as torchvision builds it: 7x7 stem, 4 stages of 2 basic blocks."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


if __name__ == "__main__":
    sys.exit(main())
