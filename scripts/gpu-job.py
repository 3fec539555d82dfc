# A PyTorch NCCL job for scripts/gpu-check.sh: RANK/WORLD_SIZE ranks of
# three AllReduces per step and a synchronize. From step SLOW_AFTER on,
# SLOW_RANK slows down, by SLOW_KIND:
# - gpu (default): its stream runs eight 8192^3 bf16 matrix products before
#   each step's AllReduces: its host issues on time, its kernels start late;
# - link: its sends go at SLOW_LINK_MBPS (it writes the rate into
#   RANKSCOPE_SLOW_SEND_FILE, which librankscope-slow-send.so, preloaded,
#   reads), until step SLOW_UNTIL.
import json, os, time

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
slow, steps = int(os.environ.get("SLOW_RANK", "-1")), int(os.environ.get("STEPS", "300"))
slow_after = int(os.environ.get("SLOW_AFTER", "0"))
kind, slow_until = os.environ.get("SLOW_KIND", "gpu"), int(os.environ.get("SLOW_UNTIL", str(steps)))
link_file = os.environ.get("RANKSCOPE_SLOW_SEND_FILE", "")


def slow_link(mbps):
    if rank == slow and kind == "link" and link_file:
        with open(link_file, "w") as f:
            f.write(str(mbps))

device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
x = torch.ones(1 << 20, device=device)
a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
t0, marks = time.monotonic(), {"t0_unix": round(time.time(), 3)}
for s in range(steps):
    if s == slow_after:
        marks["slow_from_s"] = round(time.monotonic() - t0, 3)
        slow_link(os.environ.get("SLOW_LINK_MBPS", "400"))
    if s == slow_until and kind == "link":
        marks["slow_until_s"] = round(time.monotonic() - t0, 3)
        slow_link(0)
    if rank == slow and kind == "gpu" and s >= slow_after:
        for _ in range(8):
            a = (a @ a).clamp_(-1, 1)
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    time.sleep(0.01)  # the host's own work between steps
marks["end_s"] = round(time.monotonic() - t0, 3)
if rank == 0:
    print("nccl", torch.cuda.nccl.version(), "torch", torch.__version__, json.dumps(marks), flush=True)
dist.destroy_process_group()
