"""The conv2d workload of `rdna1-kmgr vm-test gpu BDF --workload conv2d`: GPU results against the CPU's.

    python3 conv2d.py [--device cuda] [--sweep standard|matrix|smoke|experiment|experiment-quick]
                      [--cudnn on|off] [--benchmark on|off] [--events] [--case-limit S]

Conv2d forward and backward for kernel sizes 1, 3, 5, 7 and 11, and a ResNet-18 forward (defined here:
torch only, no torchvision), each run on DEVICE and on the CPU with the same seeded inputs and weights.
`--sweep matrix` is the experiment's: kernel sizes 1-11 at spatial sizes on both sides of 42x42 (where
GEMM convolutions hung on the seeds' board) up to 512x512, a few channel counts and batch sizes;
`--sweep smoke` is two small cases, for a CPU-against-CPU run in an emulated guest.
Prints one JSON object: {"device", "tolerance", "cases": [{case, max_abs_err, ok}], "ok"}; or, when it
cannot run, {"error": ...} and exit code 3.

`--sweep experiment` is the experiment's workload (the host's `rdna1-kmgr experiment` and the VFIO matrix run
this same file): stages in order, stopping after the first that fails: smoke (a tensor to the GPU and back, a sum,
a matmul), conv2d (kernel sizes 1-11 forward and backward, on both
sides of 42x42), variants (stride 2, dilation, groups, depthwise, ConvTranspose2d, channels_last), batchnorm (a
training step), fp16 (where the device has it), int8 (torch._int_mm: hipBLASLt, which has no gfx101X code by
design, so a hipBLASLt failure there is a case not applicable, not a failure), sustained (a short loop) and
triton (torch.compile with the inductor backend, whose kernels Triton generates: skipped with its reason where
Triton is absent). `--cudnn`/`--benchmark` set
torch.backends.cudnn (MIOpen on ROCm). With `--events` every case start, result and a heartbeat (each second)
is a line `@@rdna1-kmgr {json}` as it happens, so the host can tell a slow first-run MIOpen compilation (its
cache grows) from a hang; the report, the last line, also carries the versions (torch, HIP, rocm-sdk-core,
MIOpen) and, per case, what went wrong: {"outcome": "error", "error": "<the exception's text>"}. ROCm's torch names
the GPU "cuda"; `--device cpu` compares the
CPU with itself, a smoke test of this script on a machine without a GPU.

Tolerance: |gpu - cpu| <= ATOL + RTOL * |cpu| elementwise, in float32 (TF32 off). A correct GPU differs
from the CPU only by rounding: other convolution algorithms (Winograd, FFT, implicit GEMM) sum the
C*k*k products in another order, which for these sizes moves results by ~1e-5 relative; 1e-3 leaves
room for that and for ResNet-18's 20 layers. What the quirks guard against (VRAM mapped with the wrong
memory type, stale or torn reads) corrupts whole lines of data, errors of order 1, far above it.
"""

import argparse
import copy
import json
import re
import sys
import threading
import time

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
    parser.add_argument("--sweep", default="standard", choices=("standard", "experiment", "experiment-quick", *SWEEPS))
    parser.add_argument("--cudnn", choices=("on", "off"), default="on")
    parser.add_argument("--benchmark", choices=("on", "off"), default="off")
    parser.add_argument("--events", action="store_true")
    parser.add_argument("--case-limit", type=float, default=120.0)
    args = parser.parse_args(argv)
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - any import failure means "cannot run"
        return fail(f"cannot import torch: {err}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return fail(
            f"torch {torch.__version__} sees no GPU (torch.cuda.is_available() is False; "
            f"HIP {getattr(torch.version, 'hip', None)})"
        )
    # Exact float32 on both sides: TF32 would loosen the GPU's results by design.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    torch.backends.cudnn.enabled = args.cudnn == "on"
    torch.backends.cudnn.benchmark = args.benchmark == "on"
    if args.sweep.startswith("experiment"):
        print(json.dumps(run_experiment(torch, device, args)), flush=True)
        return 0
    cases = []
    if args.sweep == "standard":
        for k in KERNEL_SIZES:
            cases += conv_cases(torch, device, k)
        cases.append(resnet_case(torch, device))
    else:
        for shape in SWEEPS[args.sweep]:
            cases += conv_cases(torch, device, *shape)
    print(
        json.dumps(
            {
                "device": args.device,
                "torch": torch.__version__,
                "sweep": args.sweep,
                "tolerance": {"rtol": RTOL, "atol": ATOL, "dtype": "float32"},
                "cases": cases,
                "ok": all(c["ok"] for c in cases),
            }
        )
    )
    return 0


def fail(why: str) -> int:
    print(json.dumps({"error": why}))
    return 3


def compare(torch, name: str, got, want, rtol: float = RTOL, atol: float = ATOL, scaled: bool = False) -> dict:
    """`got` (the device's, copied back here) against `want` (the CPU's), elementwise within tolerance;
    `scaled`: relative to the tensor's largest value (float16 rounds every partial sum to 11 bits)."""
    got = got.detach().cpu().float()
    want = want.detach().float()
    diff = (got - want).abs()
    scale = want.abs().max() if scaled and want.numel() else want.abs()
    ok = bool(torch.isfinite(got).all()) and bool((diff <= atol + rtol * scale).all())
    return {"case": name, "max_abs_err": float(diff.max()) if diff.numel() else 0.0, "ok": ok}


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
    name = (
        f"conv2d k={k}"
        if (hw, cin, cout, batch) == (32, 16, 32, 2)
        else f"conv2d k={k} {hw}x{hw} c{cin}->{cout} n{batch}"
    )
    return [
        compare(torch, f"{name} forward", dev[0], cpu[0]),
        compare(torch, f"{name} backward input", dev[1], cpu[1]),
        compare(torch, f"{name} backward weight", dev[2], cpu[2]),
    ]


# --- the experiment's workload (--sweep experiment) -----------------------------------------------------------

EVENT = "@@rdna1-kmgr "  # prefix of an event line; the report is the last plain JSON line
HALF_RTOL, HALF_ATOL = 1e-2, 1e-3  # float16 on the device against float32 on the CPU, scaled by the largest value
CURRENT_CASE = None  # the case running now: the heartbeat names it (a test's stand-in device reads it too)


class Events:
    """Event lines as they happen, and a heartbeat each second while the process lives (MIOpen compiling a
    kernel for its first run takes minutes and prints nothing)."""

    def __init__(self, on: bool, beat: float = 1.0):
        self.on, self.lock, self.started = on, threading.Lock(), time.monotonic()
        if on:
            threading.Thread(target=self._beat, args=(beat,), daemon=True).start()

    def say(self, **fields) -> None:
        if self.on:
            with self.lock:
                sys.stdout.write(EVENT + json.dumps(fields) + "\n")
                sys.stdout.flush()

    def _beat(self, every: float) -> None:
        while True:
            time.sleep(every)
            self.say(event="beat", case=CURRENT_CASE, seconds=round(time.monotonic() - self.started, 1))


def versions(torch, device) -> dict:
    found = {
        "torch": torch.__version__,
        "hip": getattr(torch.version, "hip", None),
        "rocm_sdk_core": None,
        "miopen": None,
        "device": None,
        "arch": None,
    }
    try:
        from importlib import metadata

        found["rocm_sdk_core"] = metadata.version("rocm-sdk-core")
    except Exception:  # noqa: BLE001 - not a TheRock install
        pass
    for key, read in (
        ("miopen", lambda: torch.backends.cudnn.version()),
        ("device", lambda: torch.cuda.get_device_name(0)),
        ("arch", lambda: torch.cuda.get_device_properties(0).gcnArchName),
    ):
        if device.type != "cpu":
            try:
                found[key] = read()
            except Exception:  # noqa: BLE001 - a CPU build, a CUDA build: not there
                pass
    return found


def layer_case(torch, device, name: str, make, shape: tuple, memory_format=None, half: bool = False) -> list:
    """A layer's forward output and the input and weight gradients of a sum of squares, on the device (from a
    copy of the CPU's layer and input) against the CPU in float32."""
    gen = torch.Generator().manual_seed(SEED + len(name))
    layer = make()
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    x = torch.randn(*shape, generator=gen)
    dev_layer = copy.deepcopy(layer).to(device, dtype=torch.half if half else None)
    dev_x = x.clone().to(device, dtype=torch.half if half else None)
    if memory_format is not None:
        dev_layer = dev_layer.to(memory_format=memory_format)
        dev_x = dev_x.contiguous(memory_format=memory_format)
    dev_x.requires_grad_(True)
    out = dev_layer(dev_x)
    (out.float() * out.float()).sum().backward()
    cpu_x = x.clone().requires_grad_(True)
    want = layer(cpu_x)
    (want * want).sum().backward()
    tol = {"rtol": HALF_RTOL, "atol": HALF_ATOL, "scaled": True} if half else {}
    return [
        compare(torch, f"{name} forward", out, want, **tol),
        compare(torch, f"{name} backward input", dev_x.grad, cpu_x.grad, **tol),
        compare(torch, f"{name} backward weight", dev_layer.weight.grad, layer.weight.grad, **tol),
    ]


def smoke_cases(torch, device) -> list:
    gen = torch.Generator().manual_seed(SEED)
    x, a, b = torch.randn(4096, generator=gen), torch.randn(64, 96, generator=gen), torch.randn(96, 48, generator=gen)
    on = x.to(device)
    return [
        compare(torch, "smoke to gpu and back", on, x),
        compare(torch, "smoke sum", on.sum(), x.sum()),
        compare(torch, "smoke matmul", a.to(device) @ b.to(device), a @ b),
    ]


def batchnorm_case(torch, device) -> list:
    """One training step of conv + batch norm + ReLU with SGD: output, running mean, weights after the step."""
    nn = torch.nn
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).train()
    x = torch.randn(4, 8, 24, 24, generator=torch.Generator().manual_seed(SEED))
    results = {}
    for where, net, inp in (("device", copy.deepcopy(model).to(device), x.to(device)), ("cpu", model, x)):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        out = net(inp)
        (out * out).mean().backward()
        opt.step()
        results[where] = (out, net[1].running_mean, net[0].weight)
    dev, cpu = results["device"], results["cpu"]
    return [
        compare(torch, f"batchnorm train step {part}", d, c)
        for part, d, c in zip(("forward", "running mean", "conv weight after step"), dev, cpu, strict=False)
    ]


def sustained_case(torch, device, loops: int) -> list:
    """The same convolution forward and backward `loops` times: every round must equal the CPU's."""
    conv = torch.nn.Conv2d(16, 16, 3, padding=1)
    x = torch.randn(2, 16, 43, 43, generator=torch.Generator().manual_seed(SEED))
    want = conv(x).detach()
    dev_conv = copy.deepcopy(conv).to(device)
    dev_x = x.to(device)
    worst = {"case": f"sustained {loops} rounds", "max_abs_err": 0.0, "ok": True}
    for _ in range(loops):
        out = dev_conv(dev_x)
        (out * out).sum().backward()
        got = compare(torch, worst["case"], out, want)
        worst = {**worst, "max_abs_err": max(worst["max_abs_err"], got["max_abs_err"]), "ok": worst["ok"] and got["ok"]}
    return [worst]


def experiment_stages(torch, quick: bool) -> list:
    """[(stage, [(case, function(device) -> comparisons)])] in the order they run."""
    nn = torch.nn
    sizes = (12, 17) if quick else (32, 42, 43, 64, 128)  # both sides of 42x42 (the seeds' GEMM hang)
    chans = (3, 4, 1) if quick else (16, 32, 2)

    def conv(k, hw):
        cin, cout, n = chans if hw <= 64 else (8, 8, 1)
        return lambda d: layer_case(
            torch, d, f"conv2d k={k} {hw}x{hw}", lambda: nn.Conv2d(cin, cout, k, padding=k // 2), (n, cin, hw, hw)
        )

    def variant(name, make, shape, memory_format=None, half=False):
        return name, lambda d: layer_case(torch, d, name, make, shape, memory_format, half)

    hw = 12 if quick else 43
    return [
        ("smoke", [("smoke", lambda d: smoke_cases(torch, d))]),
        ("conv2d", [(f"conv2d k={k} {s}x{s}", conv(k, s)) for k in (1, 3, 5, 7, 9, 11) for s in sizes]),
        (
            "variants",
            [
                variant("conv2d stride 2", lambda: nn.Conv2d(8, 16, 3, stride=2, padding=1), (2, 8, hw, hw)),
                variant("conv2d dilation 2", lambda: nn.Conv2d(8, 16, 3, dilation=2, padding=2), (2, 8, hw, hw)),
                variant("conv2d groups 4", lambda: nn.Conv2d(16, 32, 3, groups=4, padding=1), (2, 16, hw, hw)),
                variant("conv2d depthwise", lambda: nn.Conv2d(16, 16, 3, groups=16, padding=1), (2, 16, hw, hw)),
                variant(
                    "convtranspose2d stride 2",
                    lambda: nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1),
                    (2, 16, hw, hw),
                ),
                variant(
                    "conv2d channels_last", lambda: nn.Conv2d(8, 16, 3, padding=1), (2, 8, hw, hw), torch.channels_last
                ),
            ],
        ),
        ("batchnorm", [("batchnorm train step", lambda d: batchnorm_case(torch, d))]),
        (
            "fp16",
            [
                variant(
                    f"conv2d fp16 k={k}", lambda k=k: nn.Conv2d(8, 16, k, padding=k // 2), (2, 8, hw, hw), half=True
                )
                for k in (1, 3, 5)
            ],
        ),
        ("int8", [("int8 matmul", lambda d: int8_cases(torch, d))]),
        ("sustained", [("sustained", lambda d: sustained_case(torch, d, 5 if quick else 50))]),
        ("triton", [("triton", lambda d: triton_cases(torch, d))]),
    ]


# int8 matrix products go through hipBLASLt (PyTorch's int8_gemm on ROCm), which TheRock does not build for gfx101X
# (TheRock #1062) and Debian ships without gfx1010 code: its failure there is a documented absence. hipBLASLt's
# and PyTorch's own words for it: a hipBLASLt/rocBLASLt error, or cuBLASLt's status under HIP's name.
NO_HIPBLASLT = re.compile(
    r"hipblaslt|rocblaslt|cublasLt|HIPBLAS_STATUS_NOT_SUPPORTED|HIPBLAS_STATUS_ARCH_MISMATCH", re.I
)
NO_HIPBLASLT_WHY = "int8 matrix products need hipBLASLt, which is not built for gfx101X (TheRock #1062)"


def int8_cases(torch, device) -> list:
    """torch._int_mm (int8 x int8 -> int32) on the device against the CPU's integer product, exact."""
    gen = torch.Generator().manual_seed(SEED)
    a = torch.randint(-8, 8, (32, 64), generator=gen, dtype=torch.int8)
    b = torch.randint(-8, 8, (64, 32), generator=gen, dtype=torch.int8)
    want = a.to(torch.int32) @ b.to(torch.int32)
    try:
        got = torch._int_mm(a.to(device), b.to(device))
    except Exception as err:  # noqa: BLE001 - hipBLASLt's absence is the expected answer on gfx101X
        text = f"{type(err).__name__}: {err}".strip()
        if not NO_HIPBLASLT.search(text):
            raise
        return [
            {
                "case": "int8 matmul",
                "max_abs_err": None,
                "ok": True,
                "outcome": "not-applicable",
                "why": NO_HIPBLASLT_WHY,
                "error": text[:2000],
            }
        ]
    return [compare(torch, "int8 matmul", got, want, rtol=0.0, atol=0.0)]


# torch.compile without a Triton to generate kernels with: inductor's own words (torch._inductor.exc.TritonMissing)
# and dynamo's for a backend it does not have (InvalidBackend).
NO_TRITON = re.compile(
    r"TritonMissing|Cannot find a working triton installation|No module named 'triton'|Invalid backend"
)


def triton_cases(torch, device) -> list:
    """A small conv + ReLU and a matmul + GELU compiled by torch.compile's inductor backend (Triton kernels on
    ROCm: the fused epilogues, the softmax), each against the CPU's eager result. Skipped with its reason where
    Triton is absent: `import triton` fails, or torch.compile raises for lack of it."""
    try:
        import triton  # noqa: F401 - only whether it is there
    except Exception as err:  # noqa: BLE001 - any import failure means "no Triton"
        return [_skipped("triton", f"no Triton: import triton failed ({type(err).__name__}: {err})")]
    gen = torch.Generator().manual_seed(SEED)
    x, w, b = torch.randn(2, 8, 17, 17, generator=gen), torch.randn(16, 8, 3, 3, generator=gen) * 0.1, torch.randn(16)
    m, n = torch.randn(64, 96, generator=gen), torch.randn(96, 48, generator=gen)

    def conv(x, w, b):
        return torch.nn.functional.conv2d(x, w, b, padding=1).relu()

    def matmul(m, n):
        return torch.softmax(torch.nn.functional.gelu(m @ n), dim=-1)

    cases = []
    for name, fn, args in (("triton conv2d relu", conv, (x, w, b)), ("triton matmul gelu softmax", matmul, (m, n))):
        try:
            got = torch.compile(fn, backend="inductor")(*(a.to(device) for a in args))
        except Exception as err:  # noqa: BLE001 - no backend is a skip; anything else is the finding
            text = f"{type(err).__name__}: {err}".strip()
            if NO_TRITON.search(text):
                return [_skipped("triton", f"no Triton: torch.compile raised {text[:300]}")]
            raise
        cases.append(compare(torch, name, got, fn(*args)))
    return cases


def _skipped(name: str, why: str) -> dict:
    return {"case": name, "max_abs_err": None, "ok": True, "outcome": "skipped", "why": why}


def run_experiment(torch, device, args) -> dict:
    """The stages in order; a stage with a case off or failing is the last. Every case is timed and
    announced; an exception is the case's result (its text tells the host which kind of failure)."""
    global CURRENT_CASE
    events = Events(args.events)
    report = {
        "device": str(device),
        "sweep": args.sweep,
        "cudnn": args.cudnn,
        "benchmark": args.benchmark,
        "tolerance": {"rtol": RTOL, "atol": ATOL, "dtype": "float32", "float16": [HALF_RTOL, HALF_ATOL]},
        "versions": versions(torch, device),
        "cases": [],
        "stages": [],
        "stopped_at": None,
    }
    events.say(event="versions", **report["versions"])
    import torch.optim  # noqa: F401 - seconds of imports (torch._dynamo): not the batchnorm case's time

    for stage, cases in experiment_stages(torch, args.sweep == "experiment-quick"):
        stage_ok = True
        for name, case in cases:
            CURRENT_CASE = name
            events.say(event="case", stage=stage, case=name, limit=args.case_limit)
            started = time.monotonic()
            try:
                results = case(device)
            except Exception as err:  # noqa: BLE001 - what failed is the finding
                text = f"{type(err).__name__}: {err}".strip()
                skipped = stage == "fp16" and "not implemented for 'Half'" in text
                results = [
                    {
                        "case": name,
                        "max_abs_err": None,
                        "ok": skipped,
                        "outcome": "skipped" if skipped else "error",
                        "error": text[:2000],
                    }
                ]
            for result in results:
                result.update(stage=stage, seconds=round(time.monotonic() - started, 3))
                events.say(event="result", **result)
            report["cases"] += results
            stage_ok = stage_ok and all(r["ok"] for r in results)
        CURRENT_CASE = None
        report["stages"].append({"stage": stage, "ok": stage_ok})
        if not stage_ok:
            report["stopped_at"] = stage
            break
    report["ok"] = report["stopped_at"] is None
    return report


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
