"""`python -m gpufleet.sim.server`: from the outside, it behaves like `sglang.launch_server`.

Startup like SGLang: scheduler processes (`sglang::scheduler_TP<n>`, holding simulated GPU
memory) and a `sglang::detokenizer` start first; the HTTP port stays closed while weights
"load"; then /health answers 503 during warm-up and 200 once the log prints
`The server is fired up and ready to roll!`. SIGTERM shuts everything down; SIGKILL of this
launcher leaves the schedulers running and holding memory, as real SGLang does.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

from gpufleet import engine_facts
from gpufleet.engine_facts import capture_sizes
from gpufleet.sim import auth, gpustate, serverargs
from gpufleet.sim.hold import set_title
from gpufleet.sim.power import ActivityMeter, gpu_slowdown
from gpufleet.sim.prefixcache import PrefixCache
from gpufleet.sim.speculation import (
    SKIP_ZERO_STEP_ENV,
    SWITCH_LINE,
    AdaptiveDepth,
    adaptive_refusal,
    initial_steps,
    parse_accept_rates,
    zero_step_costs_ms,
)
from gpufleet.sim.timing import Engine, TimingModel

READY_LINE = "The server is fired up and ready to roll!"
SEED_CRASH = (
    "RuntimeError: The size of tensor a (160) must match the size of tensor b (2) "
    "at non-singleton dimension 0"
)


def log(message: str) -> None:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


def _visible_gpu(index: int) -> int:
    """The host GPU behind CUDA's `index`, as CUDA finds it: CUDA_VISIBLE_DEVICES lists
    indexes (PCI order) or UUIDs, whole or a unique prefix, up to the first that is not."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return index
    ids = []
    for word in (w.strip() for w in visible.split(",")):
        if not word or word.startswith("-"):
            break
        ids.append(word)
    if index >= len(ids):
        raise SystemExit(
            f"CUDA error: invalid device ordinal {index} (CUDA_VISIBLE_DEVICES={visible})"
        )
    if ids[index].isdigit():
        return int(ids[index])
    uuids = ["GPU-" + u for u in gpustate.read_topology()["uuids"]]
    found = [i for i, u in enumerate(uuids) if u.startswith(ids[index])]
    if len(found) != 1:
        raise SystemExit(f"CUDA error: no CUDA-capable device is detected ({ids[index]})")
    return found[0]


def _holder(title: str) -> list[str]:
    """argv of a child process titled like SGLang's, living until the launcher stops it."""
    return [sys.executable, "-m", "gpufleet.sim.hold", "--seconds", "1e9", "--title", title]


def _memory_per_gpu(fraction: float) -> int:
    try:
        topo = gpustate.read_topology()
    except (RuntimeError, OSError, ValueError):
        return 0
    return int((topo["memory_mib"] - topo["reserved_mib"]) * fraction)


class Launcher:
    def __init__(self, args: Any) -> None:
        self.args = args
        self.children: list[subprocess.Popen] = []

    def spawn_processes(self) -> None:
        a = self.args
        per_node = max(1, a.tp_size // max(1, a.nnodes))
        mib = _memory_per_gpu(a.mem_fraction_static)
        for i in range(per_node):
            rank = a.node_rank * per_node + i
            cmd = _holder(f"sglang::scheduler_TP{rank}")
            if mib:
                cmd += ["--gpu", str(_visible_gpu(a.base_gpu_id + i)), "--mib", str(mib)]
            self._start(cmd)
        self._start(_holder("sglang::detokenizer"))

    def _start(self, cmd: list[str]) -> None:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()  # "ready": memory is registered
        proc.stdout.close()
        self.children.append(proc)

    def kill_children(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.children:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()

    def crash(self, batch: int) -> None:
        """The seeds' crash: a traceback in the log, exit 1, schedulers left orphaned."""
        log(f"Scheduler hit an exception at batch size {batch}:")
        print(
            "Traceback (most recent call last):\n"
            '  File "sglang/srt/managers/scheduler.py", line 2712, in run_scheduler_process\n'
            "    scheduler.event_loop_normal()\n"
            '  File "sglang/srt/speculative/eagle_worker.py", line 284, '
            "in forward_batch_generation\n"
            "    logits_output, next_token_ids, _ = self.target_worker.forward_batch_generation(\n"
            f"{SEED_CRASH}",
            flush=True,
        )
        log("Received sigquit from a child process. It usually means the child failed.")
        os._exit(1)


def _model(args: Any, steps: int | None = None) -> TimingModel:
    """The timing of this server (at `steps` draft depth, for adaptive speculation)."""
    if args.speculative_algorithm:
        depth = args.speculative_num_steps if steps is None else steps
        tokens = args.speculative_num_draft_tokens if steps is None else None
        model = TimingModel.speculative(
            depth,
            args.speculative_eagle_topk,
            tokens,
            parse_accept_rates(args.sim_accept_rate),
            draft_scale=args.sim_draft_cost,
            base_scale=args.sim_draft_base_cost,
        )
        if depth == 0:  # an EAGLE server at depth 0 is not plain decoding (speculation.py)
            skip = os.environ.get(SKIP_ZERO_STEP_ENV, "").lower() in ("1", "true")
            base_ms, per_req_ms = zero_step_costs_ms(
                args.speculative_eagle_topk or 1,
                skip,
                args.sim_draft_cost,
                args.sim_draft_base_cost,
            )
            model.decode_base_s, model.decode_per_req_s = base_ms / 1000, per_req_ms / 1000
            model.skips_draft_extend = skip
    else:
        model = TimingModel.baseline()
    if args.sim_decode_base_ms is not None:
        model.decode_base_s = args.sim_decode_base_ms / 1000
    if args.sim_decode_per_req_ms is not None:
        model.decode_per_req_s = args.sim_decode_per_req_ms / 1000
    model.prefill_per_token_s = args.sim_prefill_per_token_us / 1e6
    if args.sim_accept_length is not None and model.max_accept > 1:
        model.accept_length = max(1.0, min(args.sim_accept_length, model.max_accept))
        model.accept_by_domain = {}  # one mean for every prompt
    model.slowdown = getattr(args, "sim_gpu_slowdown", None)
    return model


def _adaptive(args: Any) -> tuple[AdaptiveDepth, Any] | None:
    """SGLang's adaptive speculation when asked and allowed (else static, with its log)."""
    if not (args.speculative_algorithm and args.speculative_adaptive):
        return None
    reason = adaptive_refusal(args)
    if reason:
        log(f"Adaptive speculative decoding disabled: {reason}; using static speculation.")
        return None
    start = initial_steps(args.speculative_num_steps, args.speculative_adaptive_config)
    sizes = capture_sizes(
        args.cuda_graph_bs, args.cuda_graph_max_bs_decode or args.cuda_graph_max_bs,
        args.disable_cuda_graph, max_running=args.max_running_requests, tp=args.tp_size,
    )  # fmt: skip

    def switched(old: int, new: int) -> None:
        log(SWITCH_LINE.format(old=old, new=new, a=old + 1, b=new + 1))

    depth = AdaptiveDepth(start, args.speculative_adaptive_config, sizes, switched)
    models = {}

    def model_for(steps: int) -> TimingModel:
        if steps not in models:
            models[steps] = _model(args, steps)
        return models[steps]

    log(f"AdaptiveSpeculativeParams initialized: candidate_steps by batch size "
        f"{ {k: s.candidates for k, s in depth.slots.items()} }")  # fmt: skip
    return depth, model_for


def _meter(a: Any) -> ActivityMeter | None:
    """The power meter of this server's simulated GPUs, None without them; sets the
    slowdown its GPUs' clocks or power limit impose (`_model` reads it)."""
    if not os.environ.get(gpustate.STATE_ENV):
        return None
    per_node = max(1, a.tp_size // max(1, a.nnodes))
    gpus = [_visible_gpu(a.base_gpu_id + i) for i in range(per_node)]
    a.sim_gpu_slowdown = gpu_slowdown(gpus, bool(a.speculative_algorithm))
    if a.sim_gpu_slowdown:
        log(
            f"GPUs {gpus} run below stock clocks or power: a step at batch 1 takes "
            f"{a.sim_gpu_slowdown(1):.2f}x, at 64 {a.sim_gpu_slowdown(64):.2f}x"
        )
    return ActivityMeter(gpus, speculative=bool(a.speculative_algorithm))


async def serve(launcher: Launcher) -> int:
    from aiohttp import web

    from gpufleet.sim.api import Api, ServerState

    a = launcher.args
    crashed = {"done": False}

    def on_batch(size: int) -> None:
        if a.sim_crash_at_batch is not None and size > a.sim_crash_at_batch and not crashed["done"]:
            crashed["done"] = True
            launcher.crash(size)

    meter = _meter(a)
    engine = Engine(
        _model(a), a.max_running_requests, a.sim_zero_cost, a.sim_seed, on_batch=on_batch,
        on_step=meter.step if meter else None,
        cache=None if a.disable_radix_cache else PrefixCache(a.sim_cache_tokens),
        adaptive=_adaptive(a),
    )  # fmt: skip
    engine.hold_while = a.sim_hold_while
    state = ServerState(engine, a)
    app = web.Application(middlewares=[auth.middleware(a.api_key, a.admin_api_key)])
    app.add_routes(Api(state).routes())
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, a.host, a.port, reuse_address=True)  # as uvicorn does
    try:
        await site.start()
    except OSError as exc:
        code = exc.errno if exc.errno else errno.EADDRINUSE
        log(
            f"ERROR: [Errno {code}] error while attempting to bind on address "
            f"('{a.host}', {a.port}): address already in use"
        )
        return 1
    engine_task = asyncio.create_task(engine.run())
    log(f"Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)")
    if not a.skip_server_warmup:
        log("Start of prefill warmup ...")
        await asyncio.sleep(a.sim_warmup_seconds)
    state.phase = "ready"
    log(READY_LINE)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    state.phase = "shutting_down"
    log("Gracefully exiting... shutting down")
    engine_task.cancel()
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = serverargs.parse(argv)
    set_title("sglang.launch_server (gpufleet sim) " + " ".join(argv))
    if os.environ.get(gpustate.STATE_ENV):
        gpustate.join_host()
    if (
        args.speculative_algorithm in engine_facts.CAPPED_ALGORITHMS
        and not args.explicit_max_running
    ):
        args.max_running_requests = engine_facts.SPEC_DEFAULT_MAX_RUNNING
        log(
            f"Max running requests is reset to {engine_facts.SPEC_DEFAULT_MAX_RUNNING} for "
            "speculative decoding. You can override this by explicitly setting "
            "--max-running-requests."
        )
    elif args.max_running_requests is None:
        args.max_running_requests = 4096
    shown = {k: v for k, v in vars(args).items() if not k.startswith(("sim_", "explicit_"))}
    log("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")")

    launcher = Launcher(args)
    signal.signal(signal.SIGTERM, lambda *_: (launcher.kill_children(), os._exit(0)))
    launcher.spawn_processes()
    log("Load weight begin. avail mem=139.52 GB")
    time.sleep(max(0.0, args.sim_load_seconds))
    if args.sim_crash_during_load:
        log(f"Initialization failed. warmup error: {SEED_CRASH}")
        launcher.kill_children()
        return 1
    log("Load weight end. Capture cuda graph end.")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        code = asyncio.run(serve(launcher))
    finally:
        launcher.kill_children()
    return code


if __name__ == "__main__":
    sys.exit(main())
